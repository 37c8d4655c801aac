"""The model families ingot takes, one module each (`PLUGIN`, a `ModelFamily`), registered in
`pipeline/model/family.py`'s MODEL_FAMILIES by config.json's model_type.

A family module imports only family.py (the `ModelFamily` description): no torch, so the
recipe and `ingot plan` read families without the build's packages.
"""
