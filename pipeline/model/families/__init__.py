"""The model families ingot takes, one module each (`PLUGIN`, a `ModelFamily`), registered in
`pipeline/model/family.py`'s MODEL_FAMILIES by config.json's model_type."""
