"""An EAGLE-3 draft's ONNX graphs (pipeline/heads/eagle_export.py) against the torch draft."""

from dataclasses import replace

import onnx
import pytest
import torch

from ingot.pipeline.heads.eagle_export import FC_FILE, MODEL_FILE, check_eagle, export_eagle
from ingot.pipeline.model.eagle3 import Eagle3Draft

from fixtures import model_config

BLOCK = 8


def _draft(seed: int = 0, **cfg_overrides) -> Eagle3Draft:
    cfg = model_config(num_hidden_layers=4)
    gen = torch.Generator().manual_seed(100 + seed)
    lm_head = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    embedding = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    draft = Eagle3Draft.for_target(cfg, (0, 2, 3), lm_head, embedding, seed)
    with torch.no_grad():  # widen the tiny init so the layer's output is not the residual alone
        for p in draft.parameters():
            if p.dim() == 2 and p.requires_grad:
                p.normal_(0, 0.15, generator=gen)
    if cfg_overrides:
        small = Eagle3Draft(replace(draft.cfg, **cfg_overrides))
        state = {k: v for k, v in draft.state_dict().items() if k not in ("lm_head.weight", "d2t")}
        small.load_state_dict(state, strict=False)
        small.set_embedding(embedding)
        vd = small.cfg.draft_vocab_size
        with torch.no_grad():
            small.lm_head.weight.normal_(0, 0.15, generator=gen)
            # draft id i -> target id 3 * i (a sparse draft vocabulary)
            small.d2t.copy_(torch.arange(vd) * 2)
        draft = small
    return draft.eval()


def _inputs(draft: Eagle3Draft, t: int = 21):
    gen = torch.Generator().manual_seed(1)
    features = torch.randn(t, 3 * draft.cfg.target_hidden_size, generator=gen) * 4
    ids = torch.randint(draft.cfg.vocab_size, (t,), generator=gen)
    return features, ids


@pytest.mark.parametrize("before", [True, False])
def test_graphs_match_the_torch_draft(tmp_path, before):
    draft = _draft()
    draft.cfg = replace(draft.cfg, norm_before_residual=before)
    export_eagle(draft, tmp_path, max_seq_len=64, kv_block_size=BLOCK)
    report = check_eagle(draft, tmp_path, *_inputs(draft), BLOCK)
    assert report["tokens_checked"] == 21 and report["mismatches"] == 0
    assert report["max_rel_prenorm_diff"] <= 1e-4
    names = {
        o.name for o in onnx.load(str(tmp_path / MODEL_FILE), load_external_data=False).graph.output
    }
    assert names == {"draft_tokens", "draft_hidden", "new_k_0", "new_v_0"}
    fc = onnx.load(str(tmp_path / FC_FILE), load_external_data=False)
    assert [i.name for i in fc.graph.input] == ["features"]


def test_a_draft_vocabulary_maps_to_target_ids(tmp_path):
    draft = _draft(draft_vocab_size=100)
    export_eagle(draft, tmp_path, max_seq_len=64, kv_block_size=BLOCK)
    report = check_eagle(draft, tmp_path, *_inputs(draft), BLOCK)
    assert report["mismatches"] == 0


def test_graphs_of_another_draft_fail_the_check(tmp_path):
    export_eagle(_draft(seed=1), tmp_path, max_seq_len=64, kv_block_size=BLOCK)
    draft = _draft(seed=0)
    with pytest.raises(ValueError, match="disagrees with the torch draft"):
        check_eagle(draft, tmp_path, *_inputs(draft), BLOCK)
