"""Shell completion scripts made from the CLI's own parser (``kcache completion bash|zsh|fish``),
so commands, options and values (layers, formats) never drift from what ``kcache`` accepts.

bash: ``eval "$(kcache completion bash)"`` (or save it under ``~/.local/share/bash-completion/
completions/kcache``); zsh: ``eval "$(kcache completion zsh)"`` (bash's script through
``bashcompinit``); fish: ``kcache completion fish > ~/.config/fish/completions/kcache.fish``.
Anything else (paths, keys) falls back to the shell's file completion.
"""

from __future__ import annotations

import argparse
import shlex

from kcache_schemas import wire

SHELLS = ("bash", "zsh", "fish")
# Options whose value is a cache layer.
LAYER_OPTIONS = ("--entry", "--layer", "--entries")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Each subcommand of ``parser`` with its one-line help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (sub, helps.get(name, "")) for name, sub in action.choices.items()}
    return {}


def _words(parser: argparse.ArgumentParser) -> list[str]:
    """What a word (not an option) may be here: a subcommand, or a positional's choice."""
    positional = [str(c) for a in parser._actions if not a.option_strings and a.choices is not None
                  and not isinstance(a, argparse._SubParsersAction) for c in a.choices]
    return sorted(_subcommands(parser)) + positional


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]


def _takes_value(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions if action.nargs != 0 for s in action.option_strings}


def _values(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Option -> the values it takes, where they are a known list."""
    out: dict[str, list[str]] = {}
    for action in parser._actions:
        for option in action.option_strings:
            if action.choices is not None:
                out[option] = [str(c) for c in action.choices]
            elif option in LAYER_OPTIONS:
                out[option] = list(wire.ENTRY_LAYERS) + (["kernel"] if option == "--layer" else [])
    return out


def _paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every command path (``()``, ``("push",)``, ``("local", "rm")``) with its parser."""
    out = {prefix: parser}
    for name, (sub, _help) in _subcommands(parser).items():
        out.update(_paths(sub, (*prefix, name)))
    return out


def bash(parser: argparse.ArgumentParser) -> str:
    paths = _paths(parser)
    # Per command path: its subcommands (offered for a word) and its options (for a "-" word);
    # a path with neither leaves the shell's file completion (push DIR, pull --dest DIR).
    cases = [f"    {shlex.quote(' '.join(path)) if path else chr(34) * 2}) cmds={shlex.quote(' '.join(_words(sub)))}; opts={shlex.quote(' '.join(_options(sub)))} ;;"
             for path, sub in paths.items()]
    values: dict[str, list[str]] = {}
    with_value: set[str] = set()
    for sub in paths.values():
        values.update(_values(sub))
        with_value |= _takes_value(sub)
    value_cases = [f"    {option}) COMPREPLY=( $(compgen -W {shlex.quote(' '.join(choices))} -- \"$cur\") ); return ;;"
                   for option, choices in sorted(values.items())]
    return "\n".join([
        "# kcache completion for bash (made by `kcache completion bash`)",
        "_kcache_words() {  # PATH cmds|opts|all",
        '  local cmds="" opts=""',
        '  case "$1" in',
        *cases,
        "    *) return ;;",
        "  esac",
        '  case "$2" in cmds) printf "%s" "$cmds" ;; opts) printf "%s" "$opts" ;; *) printf "%s %s" "$cmds" "$opts" ;; esac',
        "}",
        "_kcache() {",
        '  local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" path="" next i w',
        '  case "$prev" in',
        *value_cases,
        "  esac",
        "  # The command path so far: the words before the cursor that name a (sub)command.",
        "  for ((i = 1; i < COMP_CWORD; i++)); do",
        '    w="${COMP_WORDS[i]}"',
        '    case "$w" in -*) continue ;; esac',
        f'    case "${{COMP_WORDS[i-1]}}" in {"|".join(sorted(with_value))}) continue ;; esac',
        '    next="${path:+$path }$w"',
        '    if [ -n "$(_kcache_words "$next" all)" ]; then path="$next"; fi',
        "  done",
        '  case "$cur" in -*) COMPREPLY=( $(compgen -W "$(_kcache_words "$path" opts)" -- "$cur") ) ;; *) COMPREPLY=( $(compgen -W "$(_kcache_words "$path" cmds)" -- "$cur") ) ;; esac',
        "}",
        "complete -o default -F _kcache kcache",
        "",
    ])


def zsh(parser: argparse.ArgumentParser) -> str:
    return "# kcache completion for zsh: bash's, through bashcompinit\nautoload -U +X bashcompinit && bashcompinit\n" + bash(parser)


def fish(parser: argparse.ArgumentParser) -> str:
    lines = ["# kcache completion for fish (made by `kcache completion fish`)"]
    for name, (_sub, help_text) in sorted(_subcommands(parser).items()):
        lines.append(f"complete -c kcache -n __fish_use_subcommand -f -a {shlex.quote(name)} -d {shlex.quote(help_text[:60])}")
    for path, sub in _paths(parser).items():
        if not path:
            continue
        condition = shlex.quote(f"__fish_seen_subcommand_from {path[-1]}")
        for name, (_s, help_text) in sorted(_subcommands(sub).items()):
            lines.append(f"complete -c kcache -n {condition} -f -a {shlex.quote(name)} -d {shlex.quote(help_text[:60])}")
        values = _values(sub)
        for action in sub._actions:
            for option in (o for o in action.option_strings if o.startswith("--")):
                takes = f" -xa {shlex.quote(' '.join(values[option]))}" if option in values else (" -r" if action.nargs != 0 else "")
                described = f" -d {shlex.quote((action.help or '').split(' (')[0][:60])}" if action.help else ""
                lines.append(f"complete -c kcache -n {condition} -l {option[2:]}{takes}{described}")
    return "\n".join(lines) + "\n"


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](parser)
