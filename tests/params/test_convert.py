"""The layout conversion's PyTorch implementation (flowrt.params.convert), the specification the
CUDA kernel follows: it equals a naive loop over every page and every chunk, on random shapes,
dtypes, slot lists and strided stacks; and it checks what it is given."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="the conversion works on torch tensors (the torch extra)")

from flowrt.params import convert  # noqa: E402
from flowrt.params.layout import ITEM_BYTES, KVLayout, LayoutError  # noqa: E402

DTYPES = [getattr(torch, KVLayout("x", ("a",), ("b",), 1, dtype=name).torch_dtype) for name in sorted(ITEM_BYTES)]


def random_bits(shape, dtype, generator) -> torch.Tensor:
    raw = torch.randint(
        0, 256, (*shape[:-1], shape[-1] * torch.empty((), dtype=dtype).element_size()), dtype=torch.uint8, generator=generator
    )
    return raw.view(dtype)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8)


def naive_stacks_to_flat(stacks, stack_slots, flat, flat_slots):
    for i in range(len(stack_slots)):
        for c, stack in enumerate(stacks):
            bits(flat[flat_slots[i], c]).copy_(bits(stack[stack_slots[i]]))  # (flat is contiguous)


def naive_flat_to_stacks(flat, flat_slots, stacks, stack_slots):
    for i in range(len(stack_slots)):
        for c, stack in enumerate(stacks):
            stack[stack_slots[i]].view(torch.uint8).copy_(bits(flat[flat_slots[i], c]))


@st.composite
def cases(draw):
    chunks, tokens, heads, dim = (
        draw(st.integers(1, 5)),
        draw(st.integers(1, 4)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 7)),
    )
    stack_count, flat_count = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    pages = draw(st.integers(0, min(stack_count, flat_count)))
    stack_slots = draw(st.permutations(range(stack_count)))[:pages]
    flat_slots = draw(st.permutations(range(flat_count)))[:pages]
    if draw(st.booleans()) and pages:  # consecutive on both sides: the slicing path
        a, b = draw(st.integers(0, stack_count - pages)), draw(st.integers(0, flat_count - pages))
        stack_slots, flat_slots = list(range(a, a + pages)), list(range(b, b + pages))
    form = draw(st.sampled_from(["list", "range", "tensor"]))
    return {
        "shape": (tokens, heads, dim),
        "chunks": chunks,
        "stack_count": stack_count,
        "flat_count": flat_count,
        "stack_slots": stack_slots,
        "flat_slots": flat_slots,
        "form": form,
        "dtype": draw(st.sampled_from(DTYPES)),
        "strided": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def slots_as(form: str, slots: list[int]):
    if form == "tensor":
        return torch.tensor(slots, dtype=torch.int64)
    if form == "range" and slots and slots == list(range(slots[0], slots[0] + len(slots))):
        return range(slots[0], slots[0] + len(slots))
    return slots


def build(case):
    generator = torch.Generator().manual_seed(case["seed"])
    shape, dtype = case["shape"], case["dtype"]
    if case["strided"]:  # stacks that are views of one larger tensor, every other slot
        base = random_bits((case["chunks"], 2 * case["stack_count"], *shape), dtype, generator)
        stacks = [base[c, ::2] for c in range(case["chunks"])]
    else:
        stacks = [random_bits((case["stack_count"], *shape), dtype, generator) for _ in range(case["chunks"])]
    flat = random_bits((case["flat_count"], case["chunks"], *shape), dtype, generator)
    return stacks, flat


@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_stacks_to_flat_equals_the_page_by_page_chunk_by_chunk_loop(case):
    stacks, flat = build(case)
    expected = flat.clone()
    naive_stacks_to_flat(stacks, case["stack_slots"], expected, case["flat_slots"])
    before = [bits(s).clone() for s in stacks]
    convert.stacks_to_flat(
        stacks, slots_as(case["form"], case["stack_slots"]), flat, slots_as(case["form"], case["flat_slots"]), backend="torch"
    )
    assert torch.equal(bits(flat), bits(expected))
    assert all(torch.equal(bits(s), b) for s, b in zip(stacks, before, strict=True))


@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_flat_to_stacks_equals_the_page_by_page_chunk_by_chunk_loop(case):
    stacks, flat = build(case)
    expected = [s.clone() for s in stacks]
    naive_flat_to_stacks(flat, case["flat_slots"], expected, case["stack_slots"])
    before = bits(flat).clone()
    convert.flat_to_stacks(
        flat, slots_as(case["form"], case["flat_slots"]), stacks, slots_as(case["form"], case["stack_slots"]), backend="torch"
    )
    assert all(torch.equal(bits(s), bits(e)) for s, e in zip(stacks, expected, strict=True))
    assert torch.equal(bits(flat), before)
    if case["strided"]:  # the stacks were written in place: their base holds the pages too
        assert stacks[0]._base is not None


def test_the_conversion_checks_what_it_is_given():
    stacks = [torch.zeros(4, 2, 1, 3, dtype=torch.float16) for _ in range(2)]
    flat = torch.zeros(5, 2, 2, 1, 3, dtype=torch.float16)
    with pytest.raises(LayoutError, match=r"slot 4 is outside the block stacks' slots 0\.\.3"):
        convert.stacks_to_flat(stacks, [0, 4], flat, [0, 1])
    with pytest.raises(LayoutError, match=r"slot 5 is outside the flat pages' slots 0\.\.4"):
        convert.flat_to_stacks(flat, [5], stacks, [0])
    with pytest.raises(LayoutError, match=r"slots range\(3, 6\) are outside the block stacks' slots 0\.\.3"):
        convert.stacks_to_flat(stacks, range(3, 6), flat, range(3))
    with pytest.raises(LayoutError, match="2 stack slots but 1 flat slots"):
        convert.stacks_to_flat(stacks, [0, 1], flat, [0])
    with pytest.raises(LayoutError, match=r"the flat pages must be \(slots, 2, 2, 1, 3\) of torch.float16"):
        convert.stacks_to_flat(stacks, [0], flat.float(), [0])
    with pytest.raises(LayoutError, match="the block stacks differ"):
        convert.stacks_to_flat([stacks[0], stacks[1].float()], [0], flat, [0])
    with pytest.raises(LayoutError, match=r"a block stack is \(slots, page_tokens, heads, head_dim\)"):
        convert.stacks_to_flat([s[0] for s in stacks], [0], flat, [0])
    with pytest.raises(LayoutError, match=r"a flat slot is written twice in one conversion: \[1, 1\]"):
        convert.stacks_to_flat(stacks, [0, 2], flat, [1, 1])
    with pytest.raises(LayoutError, match="a stack slot is written twice"):
        convert.flat_to_stacks(flat, [0, 2], stacks, [3, 3])
    with pytest.raises(ValueError, match="backend must be one of"):
        convert.stacks_to_flat(stacks, [0], flat, [0], backend="numpy")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens where there is no CUDA device")
def test_without_cuda_the_kernel_is_not_built_and_asking_for_it_says_why():
    stacks = [torch.zeros(2, 1, 1, 1) for _ in range(2)]
    flat = torch.zeros(2, 2, 1, 1, 1)
    assert convert.kernel_status() == "no CUDA device (torch.cuda.is_available() is false)"
    with pytest.raises(LayoutError, match="needs contiguous stacks and flat pages on one CUDA device"):
        convert.stacks_to_flat(stacks, [0], flat, [1], backend="cuda")
    convert.stacks_to_flat(stacks, [0], flat, [1])  # auto: the specification, silently
    assert "module" not in convert._loaded


def test_the_kernel_sources_are_found_beside_the_module_and_are_the_top_level_cuda_dir():
    from tests.conftest import REPO

    sources = convert.kernel_sources()
    assert [p.name for p in sources] == ["kv_layout.cpp", "kv_layout.cu"]
    assert all(p.is_file() for p in sources)
    assert all(p.resolve() == (REPO / "cuda" / p.name).resolve() for p in sources)
    assert (convert.SOURCES / "kv_layout.h").is_file()
