"""How SGLang's argparse reads a server's arguments, and the options deployctl itself reads
from them: pure, for the host's flag check and for deployctl's own reading alike."""

from __future__ import annotations

# The types for the checker only: the host's flag check imports this module at each
# preflight's start (remote/files.py says why).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .protocol import OptionSpec


def resolve_flag(
    word: str, options: Mapping[str, OptionSpec], abbreviations: bool = True
) -> tuple[str, list[str]]:
    """argparse's lookup of `--name[=value]`: (the option, []) for an exact name or a unique
    prefix, ("", candidates) for an ambiguous or unknown one."""
    name = word.split("=", 1)[0]
    if name in options:
        return name, []
    if not abbreviations:
        return "", []
    matches = sorted(o for o in options if o.startswith(name) and o.startswith("--"))
    if len(matches) == 1:
        return matches[0], []
    return "", matches


def _negative_number(word: str) -> bool:
    """argparse's `^-\\d+$|^-\\d*\\.\\d+$`: `-1`, `-.5`, `-0.5`, not `-1e-3`."""
    whole, dot, fraction = word[1:].partition(".")
    if not dot:
        return whole.isdecimal()
    return (whole == "" or whole.isdecimal()) and fraction.isdecimal()


def looks_like_flag(word: str) -> bool:
    """Does argparse (3.11) take the word as an option? Not a negative number, nor a word
    with a space."""
    if not word.startswith("-") or word == "-":
        return False
    return not (_negative_number(word) or (" " in word and "=" not in word))


class Given:
    """One word of a server's command as SGLang's parser reads it: an option with the values
    it takes, or a word no option takes (`option` "" and no `candidates`: unknown or stray)."""

    __slots__ = ("candidates", "explicit", "option", "values", "word")

    def __init__(
        self, word: str, option: str, candidates: list[str], values: list[str], explicit: bool
    ) -> None:
        self.word = word  # as written: `--mem-frac=0.8`
        self.option = option  # the option it is: `--mem-fraction-static`
        self.candidates = candidates  # an ambiguous prefix's options
        self.values = values
        self.explicit = explicit  # its value came with `=`

    @property
    def name(self) -> str:
        """The flag as written, without its `=value`."""
        return self.word.partition("=")[0]

    @property
    def shown(self) -> str:
        """How the command gives it: `--tp 2`, `--tp-size=8`."""
        return " ".join([self.word, *([] if self.explicit else self.values)])


def parse_server_argv(
    argv: Sequence[str], options: Mapping[str, OptionSpec], abbreviations: bool = True
) -> list[Given]:
    """Read a server's arguments as SGLang's argparse will: each flag by its name, an alias or
    a unique prefix, its value after `=` or in the next words (as many as its kind takes)."""
    found: list[Given] = []
    index = 0
    while index < len(argv):
        word = argv[index]
        index += 1
        if not looks_like_flag(word):
            found.append(Given(word, "", [], [], False))
            continue
        _, eq, explicit = word.partition("=")
        option, matches = resolve_flag(word, options, abbreviations)
        given = Given(word, option, matches, [explicit] if eq else [], bool(eq))
        found.append(given)
        spec = options.get(option)
        if spec is None or (spec["kind"] == "any" and not eq):
            while index < len(argv) and not looks_like_flag(argv[index]):
                index += 1  # its values, if any, go with it
            continue
        if spec["kind"] in ("flag", "any") or eq:
            continue
        while index < len(argv) and not looks_like_flag(argv[index]):
            given.values.append(argv[index])
            index += 1
            if spec["kind"] != "list":
                break
    return found


def _read(dest: str, kind: str = "value", type_name: str | None = None) -> OptionSpec:
    return {"dest": dest, "kind": kind, "nargs": None, "type": type_name, "choices": None}


# The options deployctl itself reads from a server's command (the GPUs a launch needs, the
# port and address it probes, the memory a shared GPU gives, the paths it checks), by every
# name SGLang 0.5.23 declares for them; the prefixes SGLang would also take are resolved
# against these.
DEPLOYCTL_OPTIONS: dict[str, OptionSpec] = {
    "--model-path": _read("model_path", type_name="str"),
    "--model": _read("model_path", type_name="str"),
    "--speculative-draft-model-path": _read("speculative_draft_model_path", type_name="str"),
    "--speculative-draft-model": _read("speculative_draft_model_path", type_name="str"),
    "--tp-size": _read("tp_size", type_name="int"),
    "--tensor-parallel-size": _read("tp_size", type_name="int"),
    "--pp-size": _read("pp_size", type_name="int"),
    "--pipeline-parallel-size": _read("pp_size", type_name="int"),
    "--host": _read("host", type_name="str"),
    "--port": _read("port", type_name="int"),
    "--mem-fraction-static": _read("mem_fraction_static", type_name="float"),
    "--nnodes": _read("nnodes", type_name="int"),
    "--node-rank": _read("node_rank", type_name="int"),
    "--dist-init-addr": _read("dist_init_addr", type_name="str"),
    "--nccl-init-addr": _read("dist_init_addr", type_name="str"),
    "--disaggregation-mode": _read("disaggregation_mode", type_name="str"),
    "--disaggregation-bootstrap-port": _read("disaggregation_bootstrap_port", type_name="int"),
    "--disaggregation-transfer-backend": _read("disaggregation_transfer_backend", type_name="str"),
    "--disaggregation-ib-device": _read("disaggregation_ib_device", type_name="str"),
    "--speculative-algorithm": _read("speculative_algorithm", type_name="str"),
    "--speculative-num-steps": _read("speculative_num_steps", type_name="int"),
    "--speculative-eagle-topk": _read("speculative_eagle_topk", type_name="int"),
    "--speculative-adaptive": _read("speculative_adaptive", "flag"),
    "--speculative-adaptive-config": _read("speculative_adaptive_config", type_name="str"),
    "--cuda-graph-max-bs-decode": _read("cuda_graph_max_bs_decode", type_name="int"),
    "--cuda-graph-bs-decode": _read("cuda_graph_bs_decode", "list", type_name="int"),
    "--cuda-graph-max-bs-prefill": _read("cuda_graph_max_bs_prefill", type_name="int"),
    "--disable-cuda-graph": _read("disable_cuda_graph", "any"),  # a deprecated switch
    "--disable-cuda-graph-padding": _read("disable_cuda_graph_padding", "flag"),
}


class CommandValues:
    """The options deployctl reads, as the server will take them from its command: by any
    of their names or an unambiguous prefix, `--x=v` or `--x v`, the last one given winning.
    `abbreviations` off: exact names only (another program's parser, such as the router's)."""

    def __init__(self, argv: Sequence[str], abbreviations: bool = True) -> None:
        # A prefix of several options deployctl reads is read as none: SGLang refuses it (the
        # host's flag check says so), or takes an option of its own by that name.
        found = parse_server_argv(argv, DEPLOYCTL_OPTIONS, abbreviations)
        self.given = [g for g in found if g.option]

    def each(self, dest: str) -> list[Given]:
        """Every time the command gives the option, in order."""
        return [g for g in self.given if DEPLOYCTL_OPTIONS[g.option]["dest"] == dest]

    def last(self, dest: str) -> Given | None:
        found = self.each(dest)
        return found[-1] if found else None

    def get(self, dest: str) -> str | None:
        """The value the server takes; None when the command does not give it (or gives it
        no value). A switch given is ""."""
        given = self.last(dest)
        if given is None:
            return None
        if DEPLOYCTL_OPTIONS[given.option]["kind"] in ("flag", "any"):
            return ""
        return given.values[0] if given.values else None

    def has(self, dest: str) -> bool:
        return self.last(dest) is not None


def read_as(word: str) -> tuple[str, str]:
    """(dest, its first name) of the option deployctl reads `word` as; ("", "") for none."""
    option, _ = resolve_flag(word, DEPLOYCTL_OPTIONS)
    if not option:
        return "", ""
    dest = DEPLOYCTL_OPTIONS[option]["dest"]
    return dest, next(n for n, s in DEPLOYCTL_OPTIONS.items() if s["dest"] == dest)
