"""The tiers of the Global Params Pool (flowrt.params.tiers): views are zero-copy and in the
Cartesian order of the layout, coordinates are bounds-checked with messages that say where,
the host tier is the same memory in a second process, and the disk tier keeps its pages."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="the tiers hold torch tensors (the torch extra)")

from flowrt.params.layout import KVLayout, LayoutError  # noqa: E402
from flowrt.params.tiers import DeviceTier, DiskTier, HostTier, copy_slots, mapped_bytes  # noqa: E402
from tests.conftest import REPO  # noqa: E402

LAYOUT = KVLayout("kv", ("0", "1", "2"), ("k", "v"), page_tokens=4, heads=2, head_dim=8, dtype="float16")
SLOTS = 6


@pytest.fixture
def host():
    tier = HostTier.create(LAYOUT, SLOTS)
    yield tier
    tier.close()


@pytest.fixture
def disk(tmp_path):
    tier = DiskTier(tmp_path, LAYOUT, SLOTS)
    yield tier
    tier.close()


@pytest.fixture
def device():
    return DeviceTier(LAYOUT, SLOTS)


@pytest.fixture(params=["device", "host", "disk"])
def tier(request, device, host, disk):
    return {"device": device, "host": host, "disk": disk}[request.param]


def base_address(tier) -> tuple[int, int]:
    """The first byte and the size of the memory that holds the tier's pages."""
    if isinstance(tier, DeviceTier):
        raise AssertionError("a device tier has one block stack per chunk")
    return tier.bytes.data_ptr(), tier.nbytes


def test_device_views_are_the_block_stacks_memory_and_writes_show(device):
    views = device.view(["1"], 4, ["v", "k"])
    assert [tuple(v.shape) for v in views] == [LAYOUT.item_shape] * 2
    v_stack, k_stack = device.stack("1", "v"), device.stack("1", "k")
    assert views[0].data_ptr() == v_stack[4].data_ptr() and views[1].data_ptr() == k_stack[4].data_ptr()
    assert views[0].untyped_storage().data_ptr() == v_stack.untyped_storage().data_ptr()
    views[0].fill_(2.5)
    assert bool((v_stack[4] == 2.5).all()) and float(v_stack[3].abs().sum()) == 0 and float(k_stack[4].abs().sum()) == 0
    assert tuple(v_stack.shape) == (SLOTS, 4, 2, 8) and v_stack.dtype == torch.float16


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_flat_views_lie_in_the_page_at_their_chunk_offset_and_writes_show(kind, host, disk):
    tier = {"host": host, "disk": disk}[kind]
    start, size = base_address(tier)
    views = tier.view(None, 3)  # every (sub, slice), sub-major
    assert len(views) == 6
    for view, (sub, slice_) in zip(views, LAYOUT.chunks(), strict=True):
        expected = start + 3 * LAYOUT.page_bytes + LAYOUT.chunk_index(sub, slice_) * LAYOUT.chunk_bytes
        assert view.data_ptr() == expected
        assert view.untyped_storage().data_ptr() == start  # the mapping itself, not a copy
    assert start + SLOTS * LAYOUT.page_bytes <= start + size
    views[5].fill_(-1.0)  # chunk ("2", "v"): the last chunk of page 3
    page = tier.page(3).view(torch.float16)
    assert bool((page[-LAYOUT.chunk_elements :] == -1.0).all()) and float(page[: -LAYOUT.chunk_elements].abs().sum()) == 0
    assert float(tier.page(2).view(torch.float16).abs().sum()) == 0 and float(tier.page(4).view(torch.float16).abs().sum()) == 0
    with open(tier.path, "rb") as file:  # the file itself holds the write (MAP_SHARED)
        file.seek(4 * LAYOUT.page_bytes - LAYOUT.chunk_bytes)
        raw = torch.frombuffer(bytearray(file.read(LAYOUT.chunk_bytes)), dtype=torch.float16)
    assert bool((raw == -1.0).all())


def test_the_cartesian_product_is_sub_major_in_the_order_asked(tier):
    views = tier.view(["2", "0"], 1, ["v", "k"])
    for view, (value, where) in zip(views, enumerate([("2", "v"), ("2", "k"), ("0", "v"), ("0", "k")]), strict=True):
        view.fill_(value + 1)
        assert bool((tier.view([where[0]], 1, [where[1]])[0] == value + 1).all())
    assert float(tier.view(["1"], 1)[0].abs().sum()) == 0  # a chunk not asked for is untouched


def test_bounds_errors_name_the_tier_the_slot_and_the_range(tier):
    with pytest.raises(LayoutError, match=rf"the {tier.kind} tier of `kv` .*slot 6 is outside the range 0\.\.5"):
        tier.view(None, 6)
    with pytest.raises(LayoutError, match="slot -1 is outside the range 0..5"):
        tier.view(["0"], -1, ["k"])
    with pytest.raises(LayoutError, match=r"has no chunk \('9', 'k'\)"):
        tier.view(["9"], 0, ["k"])
    with pytest.raises(LayoutError, match="a slot is a whole number"):
        tier.view(None, 1.5)
    other = DeviceTier(LAYOUT, 2)
    with pytest.raises(LayoutError, match=rf"the {tier.kind} tier of `kv` .*slot 7 is outside the range 0\.\.5"):
        copy_slots(tier, [0, 7], other, [0, 1])
    with pytest.raises(LayoutError, match=r"the device tier of `kv` \(slots 0\.\.1\): slot 2 is outside the range 0\.\.1"):
        copy_slots(tier, [0, 1], other, [1, 2])


def test_flat_page_and_run_bounds(host):
    assert host.page(5).shape == (LAYOUT.page_bytes,) and host.pages(1, 4).shape == (3, LAYOUT.page_bytes)
    assert host.pages(1, 4).data_ptr() == host.page(1).data_ptr()
    with pytest.raises(LayoutError, match=r"the host tier of `kv` .*slot 6 is outside the range 0\.\.5"):
        host.page(6)
    with pytest.raises(LayoutError, match=r"slots 4\.\.6 are not a run inside 0\.\.5"):
        host.pages(4, 7)


def test_a_tier_needs_slots_and_a_copy_needs_one_layout(tmp_path):
    for make in (lambda: DeviceTier(LAYOUT, 0), lambda: HostTier.create(LAYOUT, 0), lambda: DiskTier(tmp_path, LAYOUT, -1)):
        with pytest.raises(LayoutError, match="slots >= 1"):
            make()
    with pytest.raises(LayoutError, match="the chunks or the page shape differ"):
        copy_slots(DeviceTier(LAYOUT, 2), [0], DeviceTier(LAYOUT.part(slice_names=["k"]), 2), [0])
    with pytest.raises(LayoutError, match="2 source slots but 1 destination slots"):
        copy_slots(DeviceTier(LAYOUT, 2), [0, 1], DeviceTier(LAYOUT, 2), [0])
    with pytest.raises(LayoutError, match="a destination slot appears twice"):
        copy_slots(DeviceTier(LAYOUT, 2), [0, 1], DeviceTier(LAYOUT, 2), [1, 1])


CHILD = textwrap.dedent(
    """
    import sys, torch
    from flowrt.params.layout import KVLayout
    from flowrt.params.tiers import HostTier
    layout = KVLayout.from_json(sys.argv[2])
    tier = HostTier.attach(sys.argv[1], layout, int(sys.argv[3]))
    page = tier.view(None, 2)
    mapped = tier._mapping.address
    # zero-copy: the views lie inside this process's mapping of the file, at the page's offset
    assert page[0].data_ptr() == mapped + 2 * layout.page_bytes, (page[0].data_ptr(), mapped)
    print("read", float(page[0][0, 0, 0]), float(page[-1][-1, -1, -1]))
    for view in tier.view(["1"], 5, ["k"]):
        view.fill_(7.0)
    tier.close()
    """
)


def test_a_second_process_attaches_to_the_host_tier_and_shares_its_pages(host):
    first, last = host.view(None, 2)[0], host.view(None, 2)[-1]
    first[0, 0, 0], last[-1, -1, -1] = 1.5, -3.25
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(host.path), LAYOUT.to_json(), str(SLOTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["read", "1.5", "-3.25"]
    (written,) = host.view(["1"], 5, ["k"])  # the child's write, seen through the creator's own mapping
    assert bool((written == 7.0).all())
    assert float(host.view(["1"], 5, ["v"])[0].abs().sum()) == 0
    assert host.path.exists()  # an attached process's close leaves the file to its creator


def test_the_creator_removes_the_file_and_attach_checks_its_size(tmp_path):
    tier = HostTier.create(LAYOUT, SLOTS)
    path = tier.path
    assert path.name.startswith("flowrt-mem-") and LAYOUT.layout_id() in path.name
    size = path.stat().st_size  # the pages and their labels, in whole memory pages: a few slots more may fit
    assert mapped_bytes(LAYOUT, SLOTS) <= size < mapped_bytes(LAYOUT, SLOTS) + 4096
    too_many = size // LAYOUT.page_bytes + 1
    with pytest.raises(LayoutError, match=rf"holds {size} bytes, {mapped_bytes(LAYOUT, too_many)} are needed"):
        HostTier.attach(path, LAYOUT, too_many)
    attached = HostTier.attach(path, LAYOUT, SLOTS)
    attached.close()
    assert path.exists()
    tier.close()
    assert not path.exists()
    with pytest.raises(LayoutError, match="no shared file"):
        HostTier.attach(path, LAYOUT, SLOTS)


def test_the_disk_tier_keeps_its_pages_across_close_and_reopen(tmp_path):
    tier = DiskTier(tmp_path, LAYOUT, SLOTS)
    (chunk,) = tier.view(["2"], 4, ["k"])
    chunk.copy_(torch.arange(LAYOUT.chunk_elements, dtype=torch.float16).view(LAYOUT.item_shape))
    path = tier.path
    tier.close()
    assert path.stat().st_size == mapped_bytes(LAYOUT, SLOTS)  # the pages, then their labels
    again = DiskTier(tmp_path, LAYOUT, SLOTS)
    assert again.path == path
    (kept,) = again.view(["2"], 4, ["k"])
    assert torch.equal(kept.reshape(-1), torch.arange(LAYOUT.chunk_elements, dtype=torch.float16))
    assert float(again.view(["2"], 3, ["k"])[0].abs().sum()) == 0
    again.close()
    # another layout is another file: its pages never read as this one's
    other = DiskTier(tmp_path, KVLayout("kv", ("0",), ("k",), 4, 2, 8, "bfloat16"), 2)
    assert other.path != path and float(other.page(0).sum()) == 0
    other.close()


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_a_slot_holds_a_page_only_as_its_label_says_and_every_mapping_sees_the_label(kind, host, disk):
    tier = {"host": host, "disk": disk}[kind]
    page, other = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
    assert tier.holds(2, page) is None  # never labelled: holds nothing
    tier.unlabel([2])
    assert tier.holds(2, page) is None  # being written
    tier.label([2], [page])
    first = tier.holds(2, page)
    assert first is not None and first == tier.version(2)
    assert tier.holds(2, other) is None and tier.holds(3, page) is None  # another page, another slot
    twin = (
        HostTier.attach(tier.path, LAYOUT, SLOTS) if kind == "host" else DiskTier(tier.path.parent, LAYOUT, SLOTS)
    )  # another mapping of the same file: what a peer process maps
    try:
        assert twin.holds(2, page) == first
        tier.unlabel([2])  # the owner rewrites the slot: a reader that copied it sees the version move
        assert twin.holds(2, page) is None and twin.version(2) != first
        tier.label([2], [other])
        assert twin.holds(2, page) is None and twin.holds(2, other) == tier.version(2) > first
        tier.label([2], ["any-key-not-a-hash"])  # (keys that are not page hashes are labelled by a digest)
        assert twin.holds(2, "any-key-not-a-hash") is not None and twin.holds(2, "any-key-not-a-hasH") is None
    finally:
        twin.close()
