"""What llama.cpp's KV cache can do for ingot's scheduler, checked by running it (the spike's
`check` part of the llama.cpp route; runs in llamacpp_worker.py, untimed).

llama.cpp's KV is not paged by block: a context holds cells (one token each, tagged with the
sequence ids that see it), reached through llama-cpp-python 0.3.36's `llama_memory_*` calls.
Each check compares greedy tokens with a fresh decode of the same text (the reference):

- `prefix_sharing`: a shared prefix decoded once on one sequence, `llama_memory_seq_cp` to a
  second, then two different suffixes decoded on the two in one batch;
- `rollback`: k draft tokens decoded after the prompt, then `llama_memory_seq_rm` from the
  first draft's position (a rejected speculation) and greedy decoding resumed;
- `preemption`: a sequence's state saved (`llama_state_seq_get_data`), its cells removed, the
  cells reused by another sequence, then the state restored under a new sequence id and
  decoding resumed;
- `quantized_kv`: K/V cached as q8_0 (`type_k`/`type_v`) against f16; bytes per token;
- `embeddings`: `llama_set_embeddings` on a causal model: whether the lm_head's input (the
  final-norm hidden row, what Medusa heads read) comes out beside the logits, checked against
  the logits through the GGUF's own output matrix.

Each check runs with the cache split per sequence (`kv_unified` off, llama.cpp's default: one
stream of n_ctx / n_seq_max cells per sequence) and with one unified pool of cells.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np

from benchmarks.decode.engines import llama_open

__all__ = ["run_kv_check"]

SEQS = 4
PREFIX = 24  # the shared prefix: the first 24 of the 32-token prompt
TOKENS = 24  # greedy tokens compared per check
DRAFT = 4  # rejected draft tokens in the rollback check


class Context:
    """A llama.cpp context over the GGUF and the few calls the checks use."""

    def __init__(self, gguf: str, threads: int, unified: bool, kv_type: str | None = None):
        import llama_cpp as lib

        self.lib = lib
        self.model, self.ctx, self.params = llama_open(
            lib, gguf, threads, SEQS, 512, 256, kv_type, kv_unified=unified
        )
        vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = lib.llama_vocab_n_tokens(vocab)
        self.memory = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(512, 0, SEQS)

    def decode(self, entries: list[tuple[int, int, list[int], bool]]) -> None:
        """entries: (token, position, sequence ids, wants logits)."""
        b = self.batch
        b.n_tokens = len(entries)
        for i, (token, pos, seqs, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, len(seqs), logits
            for j, seq in enumerate(seqs):
                b.seq_id[i][j] = seq
        code = self.lib.llama_decode(self.ctx, b)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")

    def logits(self, index: int) -> np.ndarray:
        row = self.lib.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(row, shape=(self.n_vocab,)).copy()

    def prefill(self, tokens: list[int], seq: int, start: int = 0) -> int:
        """Decode `tokens` at positions start.. on `seq`; the greedy next token."""
        last = len(tokens) - 1
        self.decode([(t, start + i, [seq], i == last) for i, t in enumerate(tokens)])
        return int(self.logits(last).argmax())

    def greedy(self, first: dict[int, int], start: dict[int, int], n: int) -> dict[int, list]:
        """Greedy continuations of several sequences decoded together: `first` their next
        token, `start` its position; n tokens each (the first included)."""
        out = {seq: [token] for seq, token in first.items()}
        for step in range(1, n):
            seqs = list(out)
            self.decode([(out[s][-1], start[s] + step - 1, [s], True) for s in seqs])
            for i, s in enumerate(seqs):
                out[s].append(int(self.logits(i).argmax()))
        return out

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.memory, True)

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)


def _reference(c: Context, prompt: list[int]) -> list[int]:
    c.clear()
    first = c.prefill(prompt, 0)
    return c.greedy({0: first}, {0: len(prompt)}, TOKENS)[0]


def check_prefix_sharing(c: Context, a: list[int], b: list[int]) -> dict[str, Any]:
    refs = [_reference(c, a), _reference(c, b)]
    c.clear()
    c.prefill(a[:PREFIX], 1)
    started = time.perf_counter()
    c.lib.llama_memory_seq_cp(c.memory, 1, 2, -1, -1)
    copy_s = time.perf_counter() - started
    # Both suffixes in one batch: rows 0..n-1 are seq 1's, n.. seq 2's.
    sa, sb = a[PREFIX:], b[PREFIX:]
    entries = [(t, PREFIX + i, [1], i == len(sa) - 1) for i, t in enumerate(sa)]
    entries += [(t, PREFIX + i, [2], i == len(sb) - 1) for i, t in enumerate(sb)]
    c.decode(entries)
    first = {1: int(c.logits(len(sa) - 1).argmax()), 2: int(c.logits(len(entries) - 1).argmax())}
    got = c.greedy(first, {1: len(a), 2: len(b)}, TOKENS)
    return {
        "same_as_fresh": got[1] == refs[0] and got[2] == refs[1],
        "suffixes_differ": refs[0] != refs[1],
        "seq_cp_s": copy_s,
        "prefix_tokens": PREFIX,
    }


def check_rollback(c: Context, prompt: list[int]) -> dict[str, Any]:
    ref = _reference(c, prompt)
    c.clear()
    first = c.prefill(prompt, 0)
    n = len(prompt)
    draft = [(first + 1 + i) % c.n_vocab for i in range(DRAFT)]  # wrong guesses
    c.decode([(t, n + i, [0], True) for i, t in enumerate([first, *draft[:-1]])])
    removed = bool(c.lib.llama_memory_seq_rm(c.memory, 0, n, -1))
    pos_max = c.lib.llama_memory_seq_pos_max(c.memory, 0)
    got = c.greedy({0: first}, {0: n}, TOKENS)[0]
    return {"same_as_fresh": got == ref, "seq_rm_ok": removed, "pos_max_after_rm": pos_max}


def check_preemption(c: Context, prompt: list[int], other: list[int]) -> dict[str, Any]:
    ref = _reference(c, prompt)
    c.clear()
    half = TOKENS // 2
    head = c.greedy({0: c.prefill(prompt, 0)}, {0: len(prompt)}, half)[0]
    # The state holds the cells through the last decoded token (head[-1] is not in it yet).
    size = c.lib.llama_state_seq_get_size(c.ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    started = time.perf_counter()
    written = c.lib.llama_state_seq_get_data(c.ctx, buf, size, 0)
    save_s = time.perf_counter() - started
    c.lib.llama_memory_seq_rm(c.memory, 0, -1, -1)
    c.prefill(other, 0)  # another sequence takes the freed cells
    c.lib.llama_memory_seq_rm(c.memory, 0, -1, -1)
    started = time.perf_counter()
    read = c.lib.llama_state_seq_set_data(c.ctx, buf, written, 3)
    restore_s = time.perf_counter() - started
    start = len(prompt) + half - 1
    tail = c.greedy({3: head[-1]}, {3: start}, TOKENS - half + 1)[3]
    cells = start
    return {
        "same_as_fresh": head[:-1] + tail == ref,
        "state_bytes": int(written),
        "restored_bytes": int(read),
        "state_bytes_per_token": written / cells,
        "save_s": save_s,
        "restore_s": restore_s,
    }


def check_embeddings(c: Context, prompt: list[int], gguf: str) -> dict[str, Any]:
    lib = c.lib
    c.clear()
    c.prefill(prompt, 0)
    plain = c.logits(len(prompt) - 1)
    c.clear()
    lib.llama_set_embeddings(c.ctx, True)
    c.prefill(prompt, 0)
    logits = c.logits(len(prompt) - 1)
    n_embd = lib.llama_model_n_embd(c.model)
    row = lib.llama_get_embeddings_ith(c.ctx, len(prompt) - 1)
    lib.llama_set_embeddings(c.ctx, False)
    if not row:
        return {"hidden_row": False}
    hidden = np.ctypeslib.as_array(row, shape=(n_embd,)).copy()
    through_head = hidden @ _output_matrix(gguf).T  # the lm_head applied to the row
    scale = float(np.abs(logits).max())
    return {
        "hidden_row": True,
        "n_embd": int(n_embd),
        "logits_unchanged": float(np.abs(logits - plain).max()) / scale,
        "lm_head_of_row_vs_logits": float(np.abs(through_head - logits).max()) / scale,
        "argmax_equal": int(through_head.argmax()) == int(logits.argmax()),
    }


def _output_matrix(gguf: str) -> np.ndarray:
    """The GGUF's lm_head [vocab, n_embd] in fp32 (output.weight, else the tied embedding)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    tensors = {t.name: t for t in GGUFReader(gguf).tensors}
    t = tensors.get("output.weight") or tensors["token_embd.weight"]
    return dequantize(t.data, t.tensor_type).reshape(t.shape[::-1].tolist()).astype(np.float32)


def check_quantized_kv(gguf: str, threads: int, unified: bool, prompt: list[int], f16: list):
    c = Context(gguf, threads, unified, "q8_0")
    try:
        got = _reference(c, prompt)
        per_token = c.lib.llama_state_seq_get_size(c.ctx, 0) / (len(prompt) + TOKENS - 1)
    finally:
        c.close()
    lead = next((i for i, (x, y) in enumerate(zip(got, f16, strict=True)) if x != y), len(got))
    return {"greedy_equal_to_f16": lead, "of": len(got), "state_bytes_per_token": per_token}


def run_kv_check(spec: dict[str, Any]) -> dict[str, Any]:
    """Every check, with the KV split per sequence and unified. spec: gguf, threads, prompt
    (32 tokens), other (a second 32-token prompt: the divergent suffix and the preempting
    sequence)."""
    gguf, threads, a, other = spec["gguf"], spec["threads"], spec["prompt"], spec["other"]
    b = a[:PREFIX] + other[PREFIX : len(a)]
    results: dict[str, Any] = {}
    for unified in (False, True):
        c = Context(gguf, threads, unified)
        try:
            f16 = _reference(c, a)
            entry = {
                "prefix_sharing": check_prefix_sharing(c, a, b),
                "rollback": check_rollback(c, a),
                "preemption": check_preemption(c, a, other),
                "embeddings": check_embeddings(c, a, gguf),
                "context": {"n_ctx": c.lib.llama_n_ctx(c.ctx), "n_seq_max": SEQS},
            }
        finally:
            c.close()
        entry["quantized_kv"] = check_quantized_kv(gguf, threads, unified, a, f16)
        results["unified" if unified else "per_sequence"] = entry
    return results
