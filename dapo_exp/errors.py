"""The error of a config value, the one class every layer raises and the command line reports in one line.

It lives apart from the schema (:mod:`dapo_exp.config`) because the schema is assembled from the
fixes' declarations, and the fixes raise it: both import it from here.
"""


class ConfigError(ValueError):
    """A config value is invalid; the message names the field."""
