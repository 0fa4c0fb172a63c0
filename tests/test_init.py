"""`deployctl init`'s pure parts: the host words, the GPUs' links, the servers they suggest,
and the commented inventory it writes, read back by deployctl's own inventory reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from deployctl.errors import ParseError, UsageError
from deployctl.facts import Gpu, parse_topology
from deployctl.inventory import load_inventory
from deployctl.ops.init import (
    FoundSglang,
    HostSurvey,
    extended_file,
    extension_group,
    host_of,
    hosts_of,
    inventory_text,
    output_path,
    refuse_existing,
    top_level_groups,
    write_inventory,
)

TOPOLOGY = Path(__file__).parent / "data" / "topology"


def topology(name: str) -> Any:
    return parse_topology((TOPOLOGY / name).read_text())


# ---- the hosts named ----------------------------------------------------------------------


def test_a_host_word_is_an_ssh_name_or_user_at_address_and_port() -> None:
    plain = host_of("gpu-7")
    assert plain.name == "gpu-7" and "ansible_host" not in plain.vars
    full = host_of("ops@10.0.0.5:2222")
    assert full.name == "10.0.0.5_2222"
    assert (full.vars["ansible_user"], full.vars["ansible_host"], full.vars["ansible_port"]) == (
        "ops",
        "10.0.0.5",
        2222,
    )
    v6 = host_of("[fd00::5]:22")
    assert v6.vars["ansible_host"] == "fd00::5" and ":" not in v6.name
    assert host_of("ops@box").vars == {
        **host_of("box").vars,
        "ansible_user": "ops",
        "ansible_host": "box",
    }


@pytest.mark.parametrize("word", ["", "a b", "@box", "ops@", "box:port", "a@b@c"])
def test_a_word_that_names_no_host_is_refused(word: str) -> None:
    with pytest.raises(UsageError, match="is not a host"):
        host_of(word)


def test_a_host_named_twice_or_already_in_the_inventory_is_refused() -> None:
    with pytest.raises(UsageError, match="named twice: gpu1"):
        hosts_of(["gpu1", "gpu2", "gpu1"])
    with pytest.raises(UsageError, match="already in the inventory: gpu2"):
        hosts_of(["gpu1", "gpu2"], known={"gpu2": None})
    assert [h.name for h in hosts_of(["gpu1", "gpu2"], known={"gpu3": None})] == ["gpu1", "gpu2"]


# ---- the GPUs' links ----------------------------------------------------------------------


def test_gpus_joined_by_nvlink_are_one_island_whatever_their_numa_nodes() -> None:
    links = topology("nvlink-8gpu.txt")
    assert links.islands() == [list(range(8))]
    assert links.numa == {g: "0" if g < 4 else "1" for g in range(8)}
    assert links.links[(0, 7)] == "NV18" and (0, 0) not in links.links


def test_pcie_gpus_split_by_numa_node() -> None:
    assert topology("pcie-8gpu-2numa.txt").islands() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_nvlink_pairs_are_islands_of_their_own() -> None:
    pairs = topology("nvlink-pairs-4gpu.txt")
    assert pairs.islands() == [[0, 1], [2, 3]]
    assert set(pairs.numa.values()) == {None}  # N/A


def test_one_gpu_is_one_island() -> None:
    assert topology("one-gpu.txt").islands() == [[0]]


def test_a_matrix_that_is_not_one_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="no GPU matrix"):
        parse_topology("NVIDIA-SMI has failed because it couldn't communicate with the driver")
    lines = (TOPOLOGY / "pcie-8gpu-2numa.txt").read_text().splitlines()
    cut = [line if not line.startswith("GPU3") else "GPU3\tNODE\tNODE" for line in lines]
    with pytest.raises(ParseError, match="short row in nvidia-smi topo -m: GPU3"):
        parse_topology("\n".join(cut))


# ---- the servers a host's GPUs suggest ------------------------------------------------------


def gpus(count: int, name: str = "NVIDIA H200") -> list[Gpu]:
    return [Gpu(i, f"GPU-{i:04x}", name, 0, 143771, 0) for i in range(count)]


def survey_of(
    name: str = "gpu1",
    count: int = 8,
    links: str | None = "nvlink-8gpu.txt",
    ports: list[int] | None = None,
    sglang: list[FoundSglang] | None = None,
    models: list[str] | None = None,
    **more: Any,
) -> HostSurvey:
    values: dict[str, Any] = {
        "host": host_of(name),
        "hostname": name,
        "user": "ops",
        "gpus": gpus(count),
        "gpu_error": None,
        "topology": topology(links) if links else None,
        "topology_error": None,
        "pythons": [("/usr/bin/python3", "3.11.2")],
        "sglang": [
            FoundSglang(
                "/opt/sgl/bin/python",
                "3.12.3",
                "0.5.23",
                "/opt/sgl/lib",
                {"spec-disable": "missing"},
            )
        ]
        if sglang is None
        else sglang,
        "ports": ports or [22],
        "models": ["/models/llama"] if models is None else models,
        "sbatch": None,
        "machine": "m",
    }
    values.update(more)
    return HostSurvey(**values)


def test_an_nvlink_box_gets_one_server_on_every_gpu_on_the_first_free_port() -> None:
    (only,) = survey_of(ports=[22, 30000]).deployments()
    assert (only.gpus, only.tp, only.port) == (list(range(8)), 8, 30001)
    assert "NVLink (NV18)" in only.why


def test_a_pcie_box_gets_one_server_per_numa_node_each_on_its_own_port() -> None:
    first, second = survey_of(links="pcie-8gpu-2numa.txt", ports=[30001]).deployments()
    assert (first.name, first.gpus, first.tp, first.port) == ("gpus-0-3", [0, 1, 2, 3], 4, 30000)
    assert (second.name, second.gpus, second.tp, second.port) == (
        "gpus-4-7",
        [4, 5, 6, 7],
        4,
        30002,
    )
    assert "NUMA node 1" in second.why and "no NVLink" in second.why


def test_an_island_of_three_serves_on_two_and_says_which_gpu_is_left() -> None:
    text = (TOPOLOGY / "pcie-8gpu-2numa.txt").read_text()
    three = "".join(
        line + "\n"
        for line in text.splitlines()
        if not line.startswith(("GPU3", "GPU4", "GPU5", "GPU6", "GPU7"))
    )
    survey = survey_of(count=3, links=None, topology=parse_topology(three))
    (only,) = survey.deployments()
    assert (only.gpus, only.tp) == ([0, 1], 2)
    assert "GPUs [2] left out" in only.why


def test_without_links_read_every_gpu_is_one_server_and_no_gpu_none() -> None:
    (only,) = survey_of(count=2, links=None).deployments()
    assert only.gpus == [0, 1] and only.tp == 2
    assert survey_of(count=0, links=None).deployments() == []


def test_the_newest_sglang_is_chosen_the_first_found_of_equals() -> None:
    def found(python: str, version: str) -> FoundSglang:
        return FoundSglang(python, "3.11", version, "/s", {})

    survey = survey_of(sglang=[found("/a", "0.5.9"), found("/b", "0.5.17"), found("/c", "0.5.17")])
    assert survey.chosen is not None and survey.chosen.python == "/b"
    assert survey_of(sglang=[]).chosen is None


# ---- the inventory it writes --------------------------------------------------------------


def written(tmp_path: Path, text: str, name: str = "inv.yml") -> Any:
    path = tmp_path / name
    path.write_text(text)
    return load_inventory(path)


def test_the_inventory_launches_the_servers_it_suggests_and_groups_by_gpu_and_sglang(
    tmp_path: Path,
) -> None:
    pcie = survey_of("gpu2", links="pcie-8gpu-2numa.txt", models=["/models/llama", "/models/qwen"])
    none = survey_of("cpu1", count=0, links=None, sglang=[], models=[])
    text = inventory_text([survey_of("gpu1"), pcie, none], {}, "2026-12-04 10:00")
    inv = written(tmp_path, text)
    assert set(inv.groups) >= {"h200", "sglang_0_5_23", "no_gpus", "no_sglang"}
    assert inv.groups["h200"] == ["gpu1", "gpu2"] and inv.groups["no_sglang"] == ["cpu1"]
    one = inv.hosts["gpu1"].vars
    assert (one["python"], one["tp"], one["gpus"], one["port"]) == (
        "/opt/sgl/bin/python",
        8,
        list(range(8)),
        30000,
    )
    assert one["model_path"] == "/models/llama"  # the only model on gpu1
    two = inv.hosts["gpu2"].vars
    assert "model_path" not in two  # two models: the user picks
    assert two["deployments"] == {
        "gpus-0-3": {"gpus": [0, 1, 2, 3], "tp": 4, "port": 30000},
        "gpus-4-7": {"gpus": [4, 5, 6, 7], "tp": 4, "port": 30001},
    }
    assert inv.hosts["cpu1"].vars["python"] == "python3"  # the default: nothing was set
    assert (
        "# SGLang 0.5.23 with /opt/sgl/bin/python (Python 3.12.3), site /opt/sgl/lib; patch sets: spec-disable missing"
        in text
    )
    assert "# python: /path/to/python  # no SGLang found" in text


def test_one_model_on_every_host_is_set_once_for_all(tmp_path: Path) -> None:
    text = inventory_text([survey_of("a"), survey_of("b")], {}, "now")
    inv = written(tmp_path, text)
    assert inv.hosts["a"].vars["model_path"] == inv.hosts["b"].vars["model_path"] == "/models/llama"
    assert text.count("/models/llama") == 3  # all.vars, and each host's comment of what it has


def test_hosts_that_could_not_be_read_are_named_with_why_and_left_out(tmp_path: Path) -> None:
    text = inventory_text([survey_of("a")], {"b": OSError("connection refused\non port 22")}, "now")
    assert "#   b: connection refused on port 22" in text
    assert set(written(tmp_path, text).hosts) == {"a"}


def test_what_a_host_says_stays_in_its_comment_and_its_value(tmp_path: Path) -> None:
    evil = "/m\nall:\n  hosts: {evil: {}}\n# x: 'y"
    hostile = survey_of(
        "a",
        models=[evil],
        hostname="h\nb: 1",
        sglang=[FoundSglang('/p"q\n', "3", "0.5.23", "/s\n", {})],
    )
    text = inventory_text([hostile], {}, "now")
    inv = written(tmp_path, text)
    assert set(inv.hosts) == {"a"}
    assert inv.hosts["a"].vars["model_path"] == evil and inv.hosts["a"].vars["python"] == '/p"q\n'
    assert all(
        line.lstrip().startswith("#") or ":" in line for line in text.splitlines() if line.strip()
    )


# ---- the file -----------------------------------------------------------------------------


def test_a_file_replaced_is_kept_first_and_no_backup_is_ever_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "inv.yml"
    path.write_text("first\n")
    first = write_inventory(path, b"second\n", when=0)
    path_text = path.read_text()
    second = write_inventory(path, b"third\n", when=0)  # the same second: a name of its own
    assert first is not None and second is not None and first != second
    assert (first.read_text(), second.read_text(), path.read_text()) == (
        "first\n",
        path_text,
        "third\n",
    )
    assert first.name.endswith(".bak") and second.name.endswith(".bak")
    assert write_inventory(tmp_path / "new.yml", b"x\n", when=0) is None


def test_hosts_added_go_under_a_new_top_group_whose_children_join_the_existing_groups(
    tmp_path: Path,
) -> None:
    old = "# ours\nall:\n  children:\n    h200:\n      hosts:\n        old1: {port: 31000}\n"
    path = tmp_path / "inv.yml"
    path.write_text(old)
    top = extension_group(top_level_groups(path), 0)
    assert top.startswith("deployctl_init_") and extension_group({top}, 0) != top
    text = old + "\n" + inventory_text([survey_of("new1")], {}, "now", top)
    inv = written(tmp_path, text)
    assert inv.groups["h200"] == ["old1", "new1"]
    assert inv.hosts["old1"].vars["port"] == 31000 and inv.hosts["new1"].vars["tp"] == 8
    assert yaml.safe_load(text)["all"] == yaml.safe_load(old)["all"]  # nothing of it changed


def test_only_one_yaml_file_can_be_extended(tmp_path: Path) -> None:
    yml, ini = tmp_path / "a.yml", tmp_path / "b.ini"
    yml.write_text("all: {}\n")
    ini.write_text("[all]\n")
    assert extended_file([]) is None and extended_file([yml]) == yml
    with pytest.raises(UsageError, match="give -i once"):
        extended_file([yml, yml])
    for wrong in (ini, tmp_path, tmp_path / "missing.yml"):
        with pytest.raises(UsageError, match="is not a YAML inventory file"):
            extended_file([wrong])
    yml.write_text("- a list\n")
    with pytest.raises(UsageError, match="top level is not a mapping"):
        top_level_groups(yml)


def test_an_existing_file_is_refused_unless_replacing_it_was_asked(tmp_path: Path) -> None:
    path = tmp_path / "inv.yml"
    refuse_existing(path, may_replace=False)  # nothing there: fine
    path.write_text("all: {}\n")
    with pytest.raises(UsageError, match=r"inv\.yml exists"):
        refuse_existing(path, may_replace=False)
    refuse_existing(path, may_replace=True)
    assert path.read_text() == "all: {}\n"


def test_the_file_written_is_o_else_the_one_extended_else_the_projects_default(
    tmp_path: Path,
) -> None:
    given, extended = tmp_path / "o.yml", tmp_path / "inv.yml"
    assert output_path(extended, given, tmp_path) == given
    assert output_path(extended, None, tmp_path) == extended
    assert output_path(None, None, tmp_path) == tmp_path / "inventories" / "default.yml"
    assert output_path(None, None, None) == Path("inventory.yml")
