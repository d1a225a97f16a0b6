"""A decode step of minirt.genai replayed as one native program (docs/decisions.md D123).

With the shared KV cache and genai's static attention mask, every decode step has the same input shapes
and output buffers, so the session records the step's native calls once (an IOBinding run, the caches
updated in place through their past inputs) and replays them from C for the following tokens.  These
tests check that it does so on the real architectures' decoders (fp32 and int4), and that the replayed
steps give exactly the tokens and logits of the same steps run node by node."""
from __future__ import annotations

import numpy as np
import pytest

import minirt.genai as mg
from minirt import native
from minirt.native import program as _program
from tests.genai.conftest import generate

pytestmark = pytest.mark.skipif(not native.available, reason="native kernels not built (programs replay native calls)")


def _bound_programs(session) -> list:
    """The native programs IOBinding runs recorded on the session's idle arenas."""
    return [p for aplan in list(session._mplans.values()) for arena in list(aplan._free)
            for p in arena.bound_programs.values() if type(p) is _program.Program]


def _generate_with(model, prompt, new: int, obj, attr: str, value) -> tuple:
    """(tokens, logits, generator) of a greedy generation with ``obj.attr`` set to ``value`` meanwhile."""
    before = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        return generate(mg, model, prompt, new=new, logits=True)
    finally:
        setattr(obj, attr, before)


def _assert_same_generation(tokens, logits, ref_tokens, ref_logits) -> None:
    assert tokens == ref_tokens
    np.testing.assert_array_equal(np.stack(logits), np.stack(ref_logits))


@pytest.mark.parametrize("arch,kind", [("llama", "int4"), ("qwen2", "fp32"), ("phi3", "int4"), ("gemma", "fp32"),
                                       ("gemma2", "fp32-windowed")])
def test_decode_steps_replay_as_a_program_with_the_nodes_results(models, prompt, arch, kind):
    # (gemma2 windowed: its sliding-window layer's cache is a ring of 64 positions, which 80 new tokens wrap)
    model = models(arch, kind)
    assert model.io.static_mask, "genai's builder graph reads the mask for lengths only"
    tokens, logits, _ = generate(mg, model, prompt, new=80, logits=True)
    programs = _bound_programs(model.session)
    assert programs, "no decode program was recorded"
    # the step's calls: per layer at least the attention and the 4-bit / float products
    assert max(p.n for p in programs) >= 3 * len(model.io.layers)
    ref_tokens, ref_logits, _ = _generate_with(model, prompt, 80, model.session, "native_program", False)
    _assert_same_generation(tokens, logits, ref_tokens, ref_logits)


def test_a_new_generator_reuses_the_program(models, prompt):
    # each generator has its own KV cache: the program patches the caches as inputs, so the decode
    # program of one generator serves the next one of the same max_length (no new recording)
    model = models("llama", "int4")
    generate(mg, model, prompt, new=24)
    before = {id(p) for p in _bound_programs(model.session)}
    first, _, _ = generate(mg, model, prompt, new=24)
    second, _, _ = generate(mg, model, prompt, new=24)
    assert {id(p) for p in _bound_programs(model.session)} == before
    assert first == second


def test_static_mask_gives_the_tokens_of_the_growing_mask(models, prompt):
    model = models("qwen2", "int4")
    tokens, logits, _ = generate(mg, model, prompt, new=32, logits=True)
    ref_tokens, ref_logits, gen = _generate_with(model, prompt, 32, model.io, "static_mask", False)
    assert gen.mask is None
    _assert_same_generation(tokens, logits, ref_tokens, ref_logits)


def test_a_cache_bound_elsewhere_runs_the_nodes(models, prompt):
    # the program updates the cache in place through the past input; a run whose present output is bound
    # to another buffer must not replay it (the nodes fill that buffer and leave the past as it was)
    from minirt.ort_compat import OrtValue

    model = models("llama", "int4")
    _, _, gen = generate(mg, model, prompt, new=16)  # (the decode program of this max_length exists)
    assert _bound_programs(model.session)
    io, session = model.io, model.session
    binding = gen.bindings[0]
    past_k = gen.kv_cache[0][0]
    elsewhere = np.full_like(past_k, np.nan)
    binding.bind_ortvalue_output(io.layers[0][2], OrtValue(elsewhere))
    before = past_k.copy()
    total = gen.kv_len[0] - 1  # (run the last position again: its key row is known)
    gen.mask[0, :total + 1] = 1
    gen.mask[0, total + 1:] = 0
    binding.bind_cpu_input(io.input_ids, np.array([[int(gen.sequences[0, total])]], io.ids_dtype))
    binding.bind_cpu_input(io.attention_mask, gen.mask)
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(past_k, before)  # the past input is not written
    np.testing.assert_allclose(elsewhere[0, :, :total + 1], before[0, :, :total + 1], rtol=1e-5, atol=1e-6)


def test_a_windowed_cache_cannot_rewind_past_its_window(models, prompt):
    model = models("gemma2", "fp32-windowed")
    window = model.io.windows[0]
    _, _, gen = generate(mg, model, prompt, new=window)  # (past the window: the ring has wrapped)
    with pytest.raises(mg.GenAIError, match="windowed KV cache keeps the last 64 positions"):
        gen.rewind_to(len(prompt))
    gen.rewind_to(0)  # (an empty cache is always fine)
    assert gen.token_count() == 0

