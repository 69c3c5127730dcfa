def train(cfg):
    from dapo_exp.config import validate
    validate(cfg)
    return {}
