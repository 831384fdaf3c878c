"""Safe, bounded YAML reading, and how a bad value is shown in an error message.

    data = read_yaml_file("configs/default.yaml")        # a mapping, or ConfigError
    value = parse_yaml("1e-3", "override optim.lr=1e-3")   # 0.001

YAML is read with a safe loader only (no object-constructing tags); duplicate
keys, alias bombs, recursive aliases and deep nesting are refused. Plain
scalars are numbers by the YAML 1.2 core schema: `1e-3` is a float, `010` is
10 (not octal 8) and `12:30:00` is a string (not the sexagesimal 45000 of
YAML 1.1). A text in a plain subset of YAML (a run's config.yaml: no tags,
anchors or block scalars, FAST_PARSE_REFUSED) is parsed by libyaml where PyYAML
has it, with these rules; any other text, and anything libyaml refuses, by the
pure parser, whose message is the one shown. Files are read only when they are
regular files under a size cap (read_regular_file), so `/dev/zero` or a FIFO is
refused at once. Every
failure is one line (ConfigError) naming the source; show_value and truncate
keep a value quoted in such a line short.
"""

from __future__ import annotations

import collections.abc
import difflib
import errno
import math
import os
import re
import stat
import typing
from pathlib import Path

import yaml

MAX_CONFIG_BYTES = 1 << 20  # a config file larger than this is not a config
MAX_YAML_NODES = 10_000  # nodes visited through aliases; beyond this is an alias bomb
MAX_YAML_DEPTH = 32  # nesting levels; configs use 3, experiment files a few more
MAX_INT_DIGITS = 100  # a YAML integer with more digits is refused (no field needs one; Python caps str() at 4300)
SHOWN_CHARS = 80  # a value quoted in an error message is cut to this many characters


class ConfigError(ValueError):
    """A bad config, override or experiment file; str() is the one-line message."""


class ArgumentError(ConfigError):
    """A bad value of one argument of a library call, named by its parameter
    (`argument`; `shown`: the value, where the problem is about one of several),
    so that a caller can name it as its own user knows it (the CLI: by its flag)."""

    def __init__(self, argument: str, problem: str, shown: str = ""):
        self.argument, self.problem, self.shown = argument, problem, shown
        super().__init__(self.named(argument))

    def named(self, name: str) -> str:
        """The one-line message with the argument called `name`."""
        return f"{name}{' ' + self.shown if self.shown else ''}: {self.problem}"


def closest(word, choices, n: int = 1) -> list[str]:
    """The (at most n) choices spelt most like `word`, closest first: attn's one did-you-mean."""
    return difflib.get_close_matches(str(word), [str(c) for c in choices], n=n, cutoff=0.6)


def did_you_mean(*suggestions: str | None) -> str:
    """'; did you mean `x`?' for the first suggestion, to end a message's problem; '' without one."""
    return f"; did you mean `{suggestions[0]}`?" if suggestions and suggestions[0] else ""


INT_TAG, FLOAT_TAG, STR_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:str"
CORE_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")  # YAML 1.2 core schema
CORE_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and nesting deeper than MAX_YAML_DEPTH,
    and resolves plain ints and floats by the YAML 1.2 core schema (no
    sexagesimal `12:30:00`, no octal `010`, no `1_000`)."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in (INT_TAG, FLOAT_TAG)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream):
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        if self.depth > MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def fetch_flow_collection_start(self, TokenClass):
        # The scanner's cost grows with flow depth: refuse `[[[[...` before it gets there.
        if self.flow_level >= MAX_YAML_DEPTH:
            raise yaml.scanner.ScannerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` is merged, not a duplicate
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, collections.abc.Hashable):
                continue  # refused by super() as an unhashable key
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _construct_core_int(loader, node) -> int:
    text = loader.construct_scalar(node)
    digits = text.lstrip("+-")
    base = {"0o": 8, "0x": 16}.get(digits[:2], 10)
    digits = digits[2:] if base != 10 else digits
    if len(digits) > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer of {len(digits)} digits; at most {MAX_INT_DIGITS} are read", node.start_mark
        )
    try:
        return (-1 if text.startswith("-") else 1) * int(digits, base)
    except ValueError:
        raise yaml.constructor.ConstructorError(
            None, None, f"{show_value(text)} is not an integer", node.start_mark
        ) from None


def _construct_core_float(loader, node) -> float | str:
    """A float; a literal beyond the float range (1e400) stays its text, so that
    the field refusing it shows it as written."""
    text = loader.construct_scalar(node)
    special = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}
    if text.lower() in special:
        return special[text.lower()]
    try:
        value = float(text)
    except ValueError:
        raise yaml.constructor.ConstructorError(
            None, None, f"{show_value(text)} is not a number", node.start_mark
        ) from None
    return value if math.isfinite(value) else text


_StrictLoader.add_implicit_resolver(INT_TAG, CORE_INT, list("-+0123456789"))
_StrictLoader.add_implicit_resolver(FLOAT_TAG, CORE_FLOAT, list("-+.0123456789"))
_StrictLoader.add_constructor(INT_TAG, _construct_core_int)
_StrictLoader.add_constructor(FLOAT_TAG, _construct_core_float)


def _check_expansion(root, source: str) -> None:
    """Walk the composed node graph as construction would (aliases expand) and
    refuse more than MAX_YAML_NODES nodes (an alias bomb) or a depth beyond
    MAX_YAML_DEPTH (a recursive alias, or a chain of them)."""
    stack = [(root, 1)]
    visited = 0
    while stack:
        node, depth = stack.pop()
        visited += 1
        if visited > MAX_YAML_NODES:
            raise ConfigError(
                f"{source}: YAML expands to more than {MAX_YAML_NODES} nodes through aliases; refused (alias bomb?)"
            )
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(
                f"{source}: YAML nests deeper than {MAX_YAML_DEPTH} levels through aliases; refused (recursive alias?)"
            )
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend((child, depth + 1) for pair in node.value for child in pair)


# libyaml's parser and composer in C (when PyYAML has them) with _StrictLoader's resolvers and constructors: the
# same values, faster, for a text in the plain subset where the two parsers were found to agree (a
# differential fuzz): printable ASCII and newlines, with no tag (!), anchor or alias (&, *), complex key (?) or
# block scalar (|, >); libyaml alone reads a tab as a space, an empty `!` tag as '' and a later BOM as nothing.
# A run's config.yaml is such a text; a config or experiment file with a block scalar is not.
FAST_PARSE_REFUSED = re.compile(r"[^\n\x20-\x7e]|[!&*?|>]")
# and with at most this many of the characters a nesting level needs ([, {, -, :): libyaml's composer recurses
# once a level, about 300 bytes of C stack each, and crashes the process where the stack runs out (a few
# thousand levels on a small thread's stack); the pure parser refuses deep nesting in one line
FAST_PARSE_NESTING = 256


try:
    from yaml.cyaml import CParser
except ImportError:  # a PyYAML built without libyaml: _StrictLoader parses everything
    CParser = None

if CParser is not None:

    class _StrictCLoader(CParser, _StrictLoader):
        """_StrictLoader with libyaml's parser and composer, for _fast_parse's plain subset of YAML (there
        the two agree); anything it refuses, or that nests deeper than MAX_YAML_DEPTH, parse_yaml gives to
        _StrictLoader, whose message it is."""

        def __init__(self, stream):
            CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)


# what a standard tag's constructor raises given what it cannot build (`!!timestamp 2001-13-45`)
CONSTRUCTOR_ERRORS = (ValueError, TypeError, KeyError, AttributeError, OverflowError)


def _load(loader_class, text: str, source: str):
    """text's value by loader_class: composed, its expansion checked (_check_expansion), then constructed."""
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _fast_parse(text: str, source: str):
    """(text's value,) by _StrictCLoader; None where _StrictLoader must decide: libyaml absent, text outside
    the plain subset (FAST_PARSE_REFUSED) or nesting deeper than FAST_PARSE_NESTING could, or refused."""
    if CParser is None or FAST_PARSE_REFUSED.search(text) or sum(map(text.count, "[{-:")) > FAST_PARSE_NESTING:
        return None
    try:
        return (_load(_StrictCLoader, text, source),)
    except (yaml.YAMLError, *CONSTRUCTOR_ERRORS):  # ConfigError (a ValueError) too
        return None


def parse_yaml(text: str, source: str):
    """Parse YAML text safely; errors become one-line ConfigErrors naming source."""
    if (parsed := _fast_parse(text, source)) is not None:
        return parsed[0]
    try:
        return _load(_StrictLoader, text, source)
    except ConfigError:
        raise
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if "could not determine a constructor" in str(err):
            problem = f"{problem} (tags that build objects are not allowed)"
        raise ConfigError(f"{source}: not valid YAML:{where} {problem}") from None
    except CONSTRUCTOR_ERRORS as err:
        raise ConfigError(f"{source}: not valid YAML: a tagged value that cannot be built: {err}") from None


FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def open_regular_file(
    path: str | os.PathLike, limit: int, what: str, error: type[Exception] = ConfigError, follow_symlinks: bool = True
) -> typing.BinaryIO:
    """A regular file of at most `limit` bytes, opened for reading (binary): anything else is refused with
    one line naming the path (`error`) before a byte is read: a directory, device, FIFO or socket (the
    open never blocks), a file over the cap, and with follow_symlinks false a symbolic link. A reader
    that streams it checks the cap again as it reads (the file may grow). FileNotFoundError passes
    through: whether a missing file is an error is the caller's call."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except PermissionError:
        raise error(f"{path}: {what} is not readable (permission denied)") from None
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_symlinks:
            raise error(
                f"{path}: is a symbolic link, not a {what}; attn reads and writes run files only "
                "in place (replace the link by the file)"
            ) from None
        raise error(f"{path}: cannot read {what}: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        kind = next((name for test, name in FILE_KINDS if test(info.st_mode)), None)
        if kind is not None or not stat.S_ISREG(info.st_mode):
            raise error(
                f"{path}: is {kind or 'not a regular file'}, not {indefinite_article(what)} {what}"
                + (inside_hint(path, what) if stat.S_ISDIR(info.st_mode) else "")
            )
        if info.st_size > limit:
            raise error(f"{path}: {info.st_size} bytes is too large for a {what} (limit {limit})")
        return os.fdopen(fd, "rb")
    except OSError as err:
        os.close(fd)
        raise error(f"{path}: cannot read {what}: {err.strerror}") from None
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(
    path: str | os.PathLike, limit: int, what: str, error: type[Exception] = ConfigError, follow_symlinks: bool = True
) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (open_regular_file's checks; the cap checked
    again while reading, as the file may grow)."""
    with open_regular_file(path, limit, what, error, follow_symlinks) as handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            data = handle.read(min(size, limit) + 1)  # a read allocates what it asks for: the size, not the cap
            if len(data) > size:  # it grew since: read on, to one byte past the cap
                data += handle.read(limit + 1 - len(data))
        except OSError as err:
            raise error(f"{path}: cannot read {what}: {err.strerror}") from None
    if len(data) > limit:
        raise error(f"{path}: more than {limit} bytes is too large for a {what} (it grew while being read)")
    return data


FILE_IN_DIRECTORY = {"experiment file": "experiment.yaml", "config file": "config.yaml"}  # what a directory holds


def indefinite_article(noun: str) -> str:
    return "an" if noun[:1].lower() in "aeiou" else "a"


def inside_hint(directory: Path, what: str) -> str:
    """'; did you mean DIR/experiment.yaml?' when the directory holds the file meant."""
    name = FILE_IN_DIRECTORY.get(what)
    if name and (Path(directory) / name).is_file():
        return f"; did you mean {Path(directory) / name}?"
    return f" (and it holds no {name})" if name else ""


def read_yaml_file(path: str | os.PathLike, what: str = "config file"):
    """Read and parse a YAML mapping from a file with every failure as a one-line ConfigError."""
    path = Path(path)
    try:
        text = read_regular_file(path, MAX_CONFIG_BYTES, what).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: {what} is not UTF-8 text") from None
    data = parse_yaml(text, str(path))
    if data is None:
        raise ConfigError(f"{path}: {what} is empty; expected a mapping such as `optim: {{lr: 0.1}}`")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {what} must be a YAML mapping of sections, got a {type(data).__name__}")
    return data


class _QuotingDumper(yaml.SafeDumper):
    """SafeDumper that quotes every string the strict loader would read as
    something else: PyYAML writes by YAML 1.1, where `1234e56` is a string,
    and the loader reads by the YAML 1.2 core schema, where it is a number
    (a commit id, say)."""


def _represent_str(dumper, value: str):
    tag = _StrictLoader.resolve(_StrictLoader, yaml.ScalarNode, value, (True, False))
    return dumper.represent_scalar(STR_TAG, value, style="'" if tag != STR_TAG else None)


_QuotingDumper.add_representer(str, _represent_str)


def dump_yaml(data, **options) -> str:
    """data as YAML that parse_yaml reads back as the same values (options: yaml.dump's)."""
    return yaml.dump(data, Dumper=_QuotingDumper, **options)


def yaml_line(value) -> str:
    """A value as YAML flow text on one line; one YAML cannot write (a Path a library caller passed) by repr."""
    try:
        text = dump_yaml(value, default_flow_style=True, width=math.inf).strip().removesuffix("...")
    except yaml.YAMLError:
        text = repr(value)
    return " ".join(text.split())


def show_value(value, limit: int = SHOWN_CHARS) -> str:
    """A value for an error message: strings quoted, on one line, cut to `limit`
    characters (a 10,000-character override is shown by its first 80)."""
    return truncate(repr(value) if isinstance(value, str) else yaml_line(value), limit)


def truncate(text: str, limit: int = SHOWN_CHARS) -> str:
    """Text for an error message, cut to `limit` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
