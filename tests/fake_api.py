"""A scripted, local stand-in for the Anthropic Messages API.

Tests talk to it through the *real* ``anthropic`` SDK, so every byte the agent
sends is parsed, validated and answered the way the real service would:

    api = ScriptedAPI().start()
    api.script([reply(tool("bash", {"command": "ls"})), reply("done")])
    client = anthropic.Anthropic(api_key="test", base_url=api.url, max_retries=0)
    ...                              # run the agent loop against `client`
    assert api.remaining() == 0 and not api.invalid()

Why a real HTTP server instead of mocking the client object?  A mock accepts
whatever the code under test hands it.  The real API is strict: a tool_use
without its tool_result, two user turns in a row, an empty text block -- each
is a 400 that only shows up in production.  Validating here, with messages
modelled on the real ones, turns those bugs into failing tests.  Going through
HTTP also exercises the SDK's own streaming parser, error mapping and
connection handling.

Each request consumes one *step* from a queue:
  reply(...)   a normal answer (streamed as SSE when the request asks for it)
  error(...)   an HTTP error status with the API's error JSON
  hangup()     drop the connection without answering
  fn(body)     a callable, evaluated at request time, that returns a step
Invalid requests are answered with 400 and do NOT consume a step, so a script
stays aligned with the conversation even when a test provokes a bad request.

Standard library only, so it runs anywhere the tests do.
"""

from __future__ import annotations

import hashlib
import http.server
import itertools
import json
import re
import socket
import threading
import time

__all__ = ["ScriptedAPI", "text", "tool", "reply", "error", "hangup"]


# --------------------------------------------------------------------------
# Step helpers: small constructors so scripts read like a transcript.
# --------------------------------------------------------------------------

# itertools.count is safe to share between threads under the GIL, and one
# process-wide counter keeps ids unique even across several servers.
_ids = itertools.count(1)


def _new_id(prefix: str) -> str:
    # Real ids look like "toolu_01A09q...", "msg_01XF..."; a hex counter keeps
    # the shape while staying readable in assertion failures.
    return f"{prefix}_01{next(_ids):06x}"


def text(s: str) -> dict:
    """A text content block."""
    return {"type": "text", "text": s}


def tool(name: str, input: dict, id: str | None = None) -> dict:
    """A tool_use content block; the id is generated unless a test pins it."""
    return {"type": "tool_use", "id": id or _new_id("toolu"), "name": name, "input": input}


def reply(*blocks, stop_reason=None, usage=None, delay=0.0, cut_after=None) -> dict:
    """A successful assistant turn.

    Plain strings become text blocks.  stop_reason follows the real API's
    rule: "tool_use" whenever the model asked for a tool, else "end_turn".
    `usage` overrides the estimated token counts.  `delay` sleeps before every
    streamed event after the first (tests can see text arrive early);
    `cut_after=n` sends n stream events, then drops the connection.
    """
    content = [text(b) if isinstance(b, str) else b for b in blocks]
    if stop_reason is None:
        uses_tool = any(b.get("type") == "tool_use" for b in content)
        stop_reason = "tool_use" if uses_tool else "end_turn"
    return {"kind": "reply", "content": content, "stop_reason": stop_reason,
            "usage": dict(usage or {}), "delay": delay, "cut_after": cut_after}


# The error "type" the real API puts in the body for each status.
_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error",
    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
    429: "rate_limit_error", 500: "api_error", 529: "overloaded_error",
}


def _error_body(status: int, message: str, error_type: str | None = None) -> dict:
    kind = error_type or _ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error(status: int, message: str = "scripted error", error_type=None, headers=None) -> dict:
    """An HTTP error answer, e.g. error(429, headers={"retry-after": "2"})."""
    return {"kind": "error", "status": status,
            "body": _error_body(status, message, error_type),
            "headers": dict(headers or {})}


def hangup() -> dict:
    """Close the socket without sending a single byte back."""
    return {"kind": "hangup"}


# --------------------------------------------------------------------------
# Request validation: mirrors the real API closely enough to catch the
# mistakes an agent loop actually makes.  Messages follow the real ones'
# "path: problem" style so a failing test points at the offending field.
# --------------------------------------------------------------------------

class _Invalid(Exception):
    """Raised with the message a 400 invalid_request_error would carry."""


_TOP_KEYS = {
    "model", "messages", "max_tokens", "system", "tools", "tool_choice",
    "stream", "temperature", "top_p", "top_k", "stop_sequences", "metadata",
    "thinking", "service_tier", "cache_control", "output_config", "container",
    "mcp_servers",
    # newer body fields; the SDK's create() takes each as an argument
    "diagnostics", "inference_geo", "speed", "user_profile_id", "workspace_id",
    # and its beta create() (client.beta.messages), which Claude Code calls
    "context_management", "billing_policy", "compaction", "fallback_credit_token",
    "fallbacks", "thread",
}
# Per block type: every key the API accepts, and the ones it insists on.
_BLOCK_KEYS = {
    "text": {"type", "text", "cache_control", "citations"},
    "image": {"type", "source", "cache_control"},
    "document": {"type", "source", "title", "context", "citations", "cache_control"},
    "tool_use": {"type", "id", "name", "input", "cache_control"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
    "thinking": {"type", "thinking", "signature"},
    "redacted_thinking": {"type", "data"},
    "search_result": {"type", "source", "title", "content", "citations", "cache_control"},
    # a system message's tool changes: `tool` names a tool declared in `tools`
    "tool_addition": {"type", "tool", "cache_control"},
    "tool_removal": {"type", "tool", "cache_control"},
}
# What a role "system" message in `messages` may carry (an instruction in the
# middle of the conversation; clear_at and per-turn output settings are the beta
# API's), and the blocks in its content.
_SYSTEM_MESSAGE_KEYS = {"role", "content", "clear_at", "output_config"}
_SYSTEM_MESSAGE_BLOCKS = ("text", "tool_addition", "tool_removal")
_BLOCK_REQUIRED = {
    "text": ("text",), "image": ("source",), "document": ("source",),
    "tool_use": ("id", "name", "input"), "tool_result": ("tool_use_id",),
    "thinking": ("thinking", "signature"), "redacted_thinking": ("data",),
    "search_result": ("source", "title", "content"),
    "tool_addition": ("tool",), "tool_removal": ("tool",),
}
# What a tool_result may carry besides plain text: the real API takes
# documents and search results there too, not only images.
_RESULT_BLOCKS = ("text", "image", "document", "search_result")
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")      # tool definitions
_USED_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")     # names inside tool_use
_TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")             # tool_use.id, tool_result.tool_use_id
_PROPERTY_KEY = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")  # keys of input_schema.properties
_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_JSON_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
_EFFORTS = ("low", "medium", "high", "xhigh", "max")
_THINKING_DISPLAY = ("summarized", "omitted", "updates")
# A custom tool's keys: the SDK's BetaToolParam (defer_loading keeps a tool out of
# the prompt until a tool search finds it; Claude Code sends one such tool).
_CUSTOM_TOOL_KEYS = {"name", "description", "input_schema", "cache_control", "type",
                     "defer_loading", "strict", "eager_input_streaming", "input_examples",
                     "allowed_callers"}
# context_management.edits: per edit type, the keys it takes.
_EDIT_KEYS = {
    "clear_tool_uses_20250919": {"type", "trigger", "keep", "clear_at_least", "clear_tool_inputs",
                                 "exclude_tools"},
    "clear_thinking_20251015": {"type", "keep"},
    "compact_20260112": {"type", "trigger", "instructions", "pause_after_compaction"},
}
_MAX_BREAKPOINTS = 4
_MIN_THINKING_BUDGET = 1024
_BAD_SCHEMA = ("JSON schema is invalid. It must match JSON Schema draft 2020-12 "
               "(https://json-schema.org/draft/2020-12). Learn more about tool use at "
               "https://docs.claude.com/en/docs/tool-use.")

# Per model family, first match wins: (id prefix, max output tokens, context
# window), from the models overview.  Ids not listed (tests use made-up ones
# such as "claude-test") get DEFAULT_LIMITS.  A table that errs low would
# refuse requests the real API serves, so each row is the documented maximum.
_MODEL_LIMITS = (
    ("claude-opus-4-0", 32_000, 200_000), ("claude-opus-4-1", 32_000, 200_000),
    ("claude-opus-4-2", 32_000, 200_000),         # claude-opus-4-20250514
    ("claude-opus-4-5", 64_000, 200_000),
    ("claude-opus-4", 128_000, 1_000_000),        # 4.6 and later
    ("claude-sonnet-4-6", 128_000, 1_000_000),
    ("claude-sonnet-4", 64_000, 200_000),         # 4 and 4.5 (1M only behind a beta)
    ("claude-haiku-4-5", 64_000, 200_000),
    ("claude-opus-5", 128_000, 1_000_000), ("claude-sonnet-5", 128_000, 1_000_000),
    ("claude-fable-5", 128_000, 1_000_000),
)
DEFAULT_LIMITS = (64_000, 200_000)


def model_limits(model: str) -> tuple[int, int]:
    """(max output tokens, context window) for a model id."""
    for prefix, output, window in _MODEL_LIMITS:
        if model.startswith(prefix):
            return output, window
    return DEFAULT_LIMITS


def prompt_tokens(raw_len: int) -> int:
    """The server's one size estimate of a request, in tokens.

    ~4 bytes of request body per token: usage, count_tokens and the context
    window check all use it, so a test that sees one figure sees them all.
    """
    return max(1, raw_len // 4)


def _extra_keys(path: str, obj: dict, allowed) -> None:
    for key in obj:
        if key not in allowed:
            raise _Invalid(f"{path}{key}: Extra inputs are not permitted")


def _need_dict(path: str, obj) -> None:
    if not isinstance(obj, dict):
        raise _Invalid(f"{path}: Input should be a valid dictionary")


def _is_int(value) -> bool:
    # bool is an int subclass in Python, but not in JSON: True is no integer.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_tool_id(path: str, value) -> None:
    # Ids from other providers ("call:1", "fc.abc") or a lost id (None) are
    # refused: a history must be replayed with the ids the model made.
    if not isinstance(value, str):
        raise _Invalid(f"{path}: Input should be a valid string")
    if not _TOOL_ID.match(value):
        raise _Invalid(f"{path}: String should match pattern '{_TOOL_ID.pattern}'")


def _content_blocks(path: str, content):
    # A message's content: text (checked here: None) or a non-empty list of blocks.
    if isinstance(content, str):
        return _check_text(f"{path}.content", content)
    if not isinstance(content, list):
        raise _Invalid(f"{path}.content: Input should be a valid string or list")
    if not content:
        raise _Invalid(f"{path}: all messages must have non-empty content")
    return content


def _check_text(path: str, value) -> None:
    # The API rejects empty and whitespace-only text everywhere: such blocks
    # usually come from a bug that joined nothing, so fail loudly here too.
    if not isinstance(value, str):
        raise _Invalid(f"{path}: Input should be a valid string")
    if not value:
        raise _Invalid(f"{path}: text content blocks must be non-empty")
    if not value.strip():
        raise _Invalid(f"{path}: text content blocks must contain non-whitespace text")


def _schema_ok(schema) -> bool:
    """Whether a (sub)schema passes the draft 2020-12 meta-schema for the
    keywords tool schemas use: type, properties, required, items,
    additionalProperties, anyOf/oneOf/allOf. (s12's schema_problem checks the
    same keywords: keep the two in step.)

    Only what the meta-schema forbids fails here: true/false are schemas, and
    `required` may name a property that `properties` does not list.
    """
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [] if kind is None else [kind]
    if (kind == [] or not all(isinstance(k, str) and k in _JSON_TYPES for k in kinds)
            or len(set(kinds)) != len(kinds)):
        return False
    props = schema.get("properties", {})
    if not isinstance(props, dict) or not all(_schema_ok(p) for p in props.values()):
        return False
    required = schema.get("required", [])
    if (not isinstance(required, list) or not all(isinstance(r, str) for r in required)
            or len(set(required)) != len(required)):
        return False
    for key in ("anyOf", "oneOf", "allOf"):     # non-empty arrays of schemas
        subs = schema.get(key, [True])
        if not isinstance(subs, list) or not subs or not all(_schema_ok(s) for s in subs):
            return False
    return _schema_ok(schema.get("items", True)) and _schema_ok(schema.get("additionalProperties", True))


class _RequestCheck:
    """One validation pass over a request body; raises _Invalid on failure.

    A class because two facts span the whole request: how many cache_control
    breakpoints were used, and which tool_use ids were already seen.
    """

    def __init__(self, body, count_only: bool = False, raw_len: int = 0, betas=()):
        self.body = body
        self.count_only = count_only    # count_tokens needs no max_tokens
        self.raw_len = raw_len          # the request's size, for the context window
        self.betas = set(betas)         # from the anthropic-beta header
        self.breakpoints = 0
        self.seen_ids: set[str] = set()

    def run(self) -> None:
        _need_dict("body", self.body)
        _extra_keys("", self.body, _TOP_KEYS)
        self.check_scalars()
        self.check_sampling()
        self.check_metadata(self.body.get("metadata"))
        self.check_output_config("output_config", self.body.get("output_config"))
        self.check_context_management(self.body.get("context_management"))
        self.check_thinking(self.body.get("thinking"))
        self.check_tools(self.body.get("tools"))
        self.check_system(self.body.get("system"))
        self.check_messages(self.body.get("messages"))
        self.check_tool_choice(self.body.get("tool_choice"))
        self.check_tools_defined(self.body["messages"])
        if "cache_control" in self.body:       # top-level automatic caching
            self.check_cache_control("cache_control", self.body["cache_control"], count=False)
        if self.breakpoints > _MAX_BREAKPOINTS:
            raise _Invalid(f"A maximum of {_MAX_BREAKPOINTS} blocks with cache_control "
                           f"may be provided. Found {self.breakpoints}.")
        self.check_context_window()

    def check_context_window(self) -> None:
        # Last, like the real API: only a well-formed request gets measured.
        # The size is the request's own, never a step's scripted usage, so a
        # test that fakes a full context with big usage figures stays valid.
        # count_tokens exists to measure prompts of any size.
        if self.count_only:
            return
        window = model_limits(self.body["model"])[1]
        size = prompt_tokens(self.raw_len)
        if size > window:
            raise _Invalid(f"prompt is too long: {size} tokens > {window} maximum")

    def check_tools_defined(self, messages) -> None:
        # The real API refuses tool blocks in a history unless tools are
        # declared (a summary call must still send them, e.g. with
        # tool_choice none, or flatten the history to text).
        uses = any(_block_ids(m, "tool_use", "id") or _block_ids(m, "tool_result", "tool_use_id")
                   for m in messages)
        if uses and not self.body.get("tools") and not self.count_only:
            raise _Invalid("Requests which include `tool_use` or `tool_result` blocks "
                           "must define tools.")

    # -- top level ---------------------------------------------------------

    def check_scalars(self) -> None:
        body = self.body
        model = body.get("model")
        if model is None:
            raise _Invalid("model: Field required")
        if not isinstance(model, str) or not model:
            raise _Invalid("model: String should have at least 1 character")
        if not self.count_only or "max_tokens" in body:
            self.check_max_tokens(body.get("max_tokens"))
        if "stream" in body and not isinstance(body["stream"], bool):
            raise _Invalid("stream: Input should be a valid boolean")

    def check_max_tokens(self, value) -> None:
        if value is None:
            raise _Invalid("max_tokens: Field required")
        if not _is_int(value):
            raise _Invalid("max_tokens: Input should be a valid integer")
        if value < 1:
            raise _Invalid("max_tokens: Input should be greater than or equal to 1")
        # A model writes at most so many tokens per reply; asking for more is
        # refused up front, not silently capped.
        limit = model_limits(self.body["model"])[0]
        if value > limit and not self.count_only:
            raise _Invalid(f"max_tokens: {value} > {limit}, which is the maximum allowed "
                           f"number of output tokens for {self.body['model']}")

    def check_sampling(self) -> None:
        body = self.body
        if "temperature" in body:
            value = body["temperature"]
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise _Invalid("temperature: Input should be a valid number")
            if value < 0:
                raise _Invalid("temperature: Input should be greater than or equal to 0")
            if value > 1:
                raise _Invalid("temperature: Input should be less than or equal to 1")
        if "top_k" in body:
            if not _is_int(body["top_k"]):
                raise _Invalid("top_k: Input should be a valid integer")
            if body["top_k"] < 0:
                raise _Invalid("top_k: Input should be greater than or equal to 0")
        if "stop_sequences" in body:
            stops = body["stop_sequences"]
            if not isinstance(stops, list):
                raise _Invalid("stop_sequences: Input should be a valid list")
            for i, stop in enumerate(stops):
                if not isinstance(stop, str):
                    raise _Invalid(f"stop_sequences.{i}: Input should be a valid string")
                if not stop:
                    raise _Invalid("stop_sequences: each stop sequence must be non-empty")
                if not stop.strip():
                    raise _Invalid("stop_sequences: each stop sequence must contain non-whitespace")

    def check_metadata(self, metadata) -> None:
        if metadata is None:
            return
        _need_dict("metadata", metadata)
        _extra_keys("metadata.", metadata, {"user_id"})
        if metadata.get("user_id") is not None and not isinstance(metadata["user_id"], str):
            raise _Invalid("metadata.user_id: Input should be a valid string")

    def check_output_config(self, path: str, config, keys=("effort", "format", "task_budget")) -> None:
        # The body's output_config; a system message's takes effort only (format
        # stays top-level).
        if config is None:
            return
        _need_dict(path, config)
        _extra_keys(path + ".", config, keys)
        if config.get("effort") is not None and config["effort"] not in _EFFORTS:
            raise _Invalid(f"{path}.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'")

    def check_context_management(self, cm) -> None:
        # Server-side edits of the history (a beta): which old thinking blocks or
        # tool results the API drops before the model reads the request.
        if cm is None:
            return
        _need_dict("context_management", cm)
        _extra_keys("context_management.", cm, {"edits"})
        edits = cm.get("edits", [])
        if not isinstance(edits, list):
            raise _Invalid("context_management.edits: Input should be a valid list")
        for i, edit in enumerate(edits):
            path = f"context_management.edits.{i}"
            _need_dict(path, edit)
            kind = edit.get("type")
            if kind not in _EDIT_KEYS:
                tags = ", ".join(f"'{t}'" for t in _EDIT_KEYS)
                raise _Invalid(f"{path}: Input tag '{kind}' found using 'type' does not "
                               f"match any of the expected tags: {tags}")
            _extra_keys(f"{path}.{kind}.", edit, _EDIT_KEYS[kind])
            if "keep" in edit:
                self.check_keep(f"{path}.{kind}.keep", edit["keep"], kind)

    def check_keep(self, path: str, keep, kind: str) -> None:
        # clear_thinking keeps "all", {"type": "all"} or {"type": "thinking_turns",
        # "value": n}; clear_tool_uses keeps {"type": "tool_uses", "value": n}.
        counted = "thinking_turns" if kind == "clear_thinking_20251015" else "tool_uses"
        if kind == "clear_thinking_20251015" and keep == "all":
            return
        _need_dict(path, keep)
        if keep.get("type") == "all" and kind == "clear_thinking_20251015":
            return _extra_keys(path + ".", keep, {"type"})
        if keep.get("type") != counted:
            raise _Invalid(f"{path}.type: Input should be '{counted}'")
        _extra_keys(path + ".", keep, {"type", "value"})
        if not _is_int(keep.get("value")):
            raise _Invalid(f"{path}.value: Input should be a valid integer")

    def check_thinking(self, thinking) -> None:
        if thinking is None:
            return
        _need_dict("thinking", thinking)
        kind = thinking.get("type")
        if kind not in ("enabled", "disabled", "adaptive", "between_tools"):
            raise _Invalid(f"thinking: Input tag '{kind}' found using 'type' does not match "
                           "any of the expected tags: 'enabled', 'disabled', 'adaptive', "
                           "'between_tools'")
        if kind in ("disabled", "between_tools"):
            return _extra_keys(f"thinking.{kind}.", thinking, {"type"})
        _extra_keys(f"thinking.{kind}.", thinking, {"type", "budget_tokens", "display", "block_binding"}
                    if kind == "enabled" else {"type", "display", "block_binding"})
        if thinking.get("display") is not None and thinking["display"] not in _THINKING_DISPLAY:
            raise _Invalid(f"thinking.{kind}.display: Input should be 'summarized', 'omitted' or 'updates'")
        if kind != "enabled":
            return
        budget = thinking.get("budget_tokens")
        if budget is None:
            raise _Invalid("thinking.enabled.budget_tokens: Field required")
        if not _is_int(budget):
            raise _Invalid("thinking.enabled.budget_tokens: Input should be a valid integer")
        if budget < _MIN_THINKING_BUDGET:
            raise _Invalid("thinking.enabled.budget_tokens: Input should be greater than "
                           f"or equal to {_MIN_THINKING_BUDGET}")
        # Thinking is paid out of max_tokens, so the budget must leave room for
        # an answer; interleaved thinking spreads it over a turn and may not.
        max_tokens = self.body.get("max_tokens")
        interleaved = any(b.startswith("interleaved-thinking") for b in self.betas)
        if _is_int(max_tokens) and budget >= max_tokens and not interleaved:
            raise _Invalid("`max_tokens` must be greater than `thinking.budget_tokens`. Please "
                           "consult our documentation at https://docs.claude.com/en/docs/"
                           "build-with-claude/extended-thinking#max-tokens-and-context-window-size")

    def check_cache_control(self, path: str, cc, count: bool = True) -> None:
        # Only "ephemeral" exists; each one is a breakpoint and the API caps
        # them, a limit that is easy to blow through when caching every turn.
        _need_dict(path, cc)
        _extra_keys(path + ".", cc, {"type", "ttl"})
        if cc.get("type") != "ephemeral":
            raise _Invalid(f"{path}.type: Input should be 'ephemeral'")
        if "ttl" in cc and cc["ttl"] not in ("5m", "1h"):
            raise _Invalid(f"{path}.ttl: Input should be '5m' or '1h'")
        self.breakpoints += count

    def check_tool_choice(self, choice) -> None:
        if choice is None:
            return
        _need_dict("tool_choice", choice)
        _extra_keys("tool_choice.", choice, {"type", "name", "disable_parallel_tool_use"})
        if choice.get("type") not in ("auto", "any", "tool", "none"):
            raise _Invalid("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
        if choice["type"] == "tool" and not isinstance(choice.get("name"), str):
            raise _Invalid("tool_choice.name: Field required")
        # Even "none" needs tools: a choice must have something to choose from.
        tools = self.body.get("tools") or []
        if not tools:
            raise _Invalid(f"tool_choice.{choice['type']}: tool_choice may only be specified "
                           "while providing tools")
        if choice["type"] == "tool" and choice["name"] not in {t["name"] for t in tools}:
            raise _Invalid(f"Tool '{choice['name']}' not found in provided tools")

    # -- tools and system ----------------------------------------------------

    def check_tools(self, tools) -> None:
        if tools is None:
            return
        if not isinstance(tools, list):
            raise _Invalid("tools: Input should be a valid list")
        names = []
        for i, spec in enumerate(tools):
            self.check_tool(f"tools.{i}", spec)
            names.append(spec["name"])
        if len(names) != len(set(names)):
            raise _Invalid("tools: Tool names must be unique.")

    def check_tool(self, path: str, spec) -> None:
        _need_dict(path, spec)
        name = spec.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise _Invalid(f"{path}.name: String should match pattern '{_TOOL_NAME.pattern}'")
        if "cache_control" in spec:
            self.check_cache_control(f"{path}.cache_control", spec["cache_control"])
        # Server tools ({"type": "web_search_..."}) carry their own options
        # and no schema; only client ("custom") tools get the strict checks.
        if spec.get("type", "custom") != "custom":
            return
        _extra_keys(path + ".", spec, _CUSTOM_TOOL_KEYS)
        if "description" in spec and not isinstance(spec["description"], str):
            raise _Invalid(f"{path}.description: Input should be a valid string")
        for flag in ("defer_loading", "strict", "eager_input_streaming"):
            value = spec.get(flag, False)
            if not isinstance(value, bool) and not (flag == "eager_input_streaming" and value is None):
                raise _Invalid(f"{path}.{flag}: Input should be a valid boolean")
        schema = spec.get("input_schema")
        if schema is None:
            raise _Invalid(f"{path}.input_schema: Field required")
        _need_dict(f"{path}.input_schema", schema)
        if schema.get("type") != "object":
            raise _Invalid(f"{path}.input_schema.type: Input should be 'object'")
        # The API checks the schema against the JSON Schema meta-schema: a
        # property given as "string" instead of {"type": "string"}, or
        # `required` as a bare string, is a 400 before the model runs.
        if not _schema_ok(schema):
            raise _Invalid(f"{path}.custom.input_schema: {_BAD_SCHEMA}")
        for key in schema.get("properties", {}):
            if not _PROPERTY_KEY.match(key):
                raise _Invalid(f"{path}.custom.input_schema.properties: Property keys should "
                               f"match pattern '{_PROPERTY_KEY.pattern}'")

    def check_system(self, system) -> None:
        if system is None or isinstance(system, str):
            return
        if not isinstance(system, list):
            raise _Invalid("system: Input should be a valid string or a list of text blocks")
        for i, block in enumerate(system):
            path = f"system.{i}"
            _need_dict(path, block)
            if block.get("type") != "text":
                raise _Invalid(f"{path}.type: Input should be 'text'")
            self.check_block(path, block, role="system")

    # -- messages ------------------------------------------------------------

    def check_messages(self, messages) -> None:
        if messages is None:
            raise _Invalid("messages: Field required")
        if not isinstance(messages, list):
            raise _Invalid("messages: Input should be a valid list")
        if not messages:
            raise _Invalid("messages: List should have at least 1 item after validation, not 0")
        for i, msg in enumerate(messages):
            self.check_message(i, msg)
        self.check_turn_order(messages)
        for i in range(len(messages)):
            self.check_tool_pairing(messages, i)
        self.check_prefill(messages[-1])

    def check_prefill(self, last: dict) -> None:
        # A final assistant message is a prefill the model continues from; the
        # API refuses one ending in whitespace (the model would write after a
        # dangling space or newline).
        if last["role"] != "assistant":
            return
        content = last["content"]
        end = content if isinstance(content, str) else content[-1].get("text")
        if isinstance(end, str) and end != end.rstrip():
            raise _Invalid("messages: final assistant content cannot end with trailing whitespace")

    def check_message(self, i: int, msg) -> None:
        path = f"messages.{i}"
        _need_dict(path, msg)
        if msg.get("role") == "system":
            return self.check_system_message(i, msg)
        _extra_keys(path + ".", msg, {"role", "content"})
        if msg.get("role") not in ("user", "assistant"):
            raise _Invalid(f"{path}.role: Input should be 'user', 'assistant' or 'system'")
        if "content" not in msg:
            raise _Invalid(f"{path}.content: Field required")
        if (blocks := _content_blocks(path, msg["content"])) is not None:
            self.check_blocks(path, blocks, msg["role"])

    def check_system_message(self, i: int, msg: dict) -> None:
        # An instruction in the middle of the conversation (Claude Code sends its
        # environment this way): text, or a change to the tools on offer; per-turn
        # output settings beside it. It speaks to the turn it follows, so it cannot
        # open the conversation.
        path = f"messages.{i}"
        _extra_keys(path + ".", msg, _SYSTEM_MESSAGE_KEYS)
        if i == 0:
            raise _Invalid(f'{path}.role: first message must use the "user" role, not "system"')
        if msg.get("clear_at") not in (None, "next_user_message", "never"):
            raise _Invalid(f"{path}.clear_at: Input should be 'next_user_message' or 'never'")
        self.check_output_config(f"{path}.output_config", msg.get("output_config"), keys=("effort",))
        if "content" not in msg:
            if msg.get("output_config") is None:
                raise _Invalid(f"{path}.content: Field required")
            return
        for j, block in enumerate(_content_blocks(path, msg["content"]) or []):
            bpath = f"{path}.content.{j}"
            _need_dict(bpath, block)
            if block.get("type") not in _SYSTEM_MESSAGE_BLOCKS:
                raise _Invalid(f"{bpath}.type: Input should be 'text', 'tool_addition' or 'tool_removal'")
            self.check_block(bpath, block, "system")
            if block["type"] != "text":
                self.check_tool_change(bpath, block)

    def check_tool_change(self, path: str, block: dict) -> None:
        # A tool_addition or tool_removal names its tool by reference; an
        # addition may also carry the definition itself.
        kinds = ("tool_reference", "mcp_tool_reference", "mcp_toolset_reference")
        if block["type"] == "tool_addition":
            kinds += ("tool_definition",)
        tool = block["tool"]
        _need_dict(f"{path}.tool", tool)
        if tool.get("type") not in kinds:
            tags = ", ".join(f"'{k}'" for k in kinds)
            raise _Invalid(f"{path}.tool: Input tag '{tool.get('type')}' found using 'type' does "
                           f"not match any of the expected tags: {tags}")

    def check_blocks(self, path: str, content: list, role: str) -> None:
        seen_other = False
        for j, block in enumerate(content):
            bpath = f"{path}.content.{j}"
            self.check_block(bpath, block, role)
            # The API reads tool results positionally: they lead the turn,
            # any extra text (e.g. a reminder) follows them.
            if block["type"] != "tool_result":
                seen_other = True
            elif seen_other:
                raise _Invalid(f"{bpath}: tool_result blocks must come first in the "
                               "content of a user message, before any other block")

    def check_block(self, path: str, block, role: str) -> None:
        _need_dict(path, block)
        kind = block.get("type")
        if kind is None:
            raise _Invalid(f"{path}.type: Field required")
        if kind not in _BLOCK_KEYS:
            tags = ", ".join(f"'{t}'" for t in _BLOCK_KEYS)
            raise _Invalid(f"{path}: Input tag '{kind}' found using 'type' does not "
                           f"match any of the expected tags: {tags}")
        if kind in ("tool_addition", "tool_removal") and role != "system":
            raise _Invalid(f"{path.rsplit('.', 1)[0]}: '{kind}' blocks are only permitted "
                           "within system messages.")
        _extra_keys(path + ".", block, _BLOCK_KEYS[kind])
        for field in _BLOCK_REQUIRED[kind]:
            if field not in block:
                raise _Invalid(f"{path}.{field}: Field required")
        if "cache_control" in block:
            self.check_cache_control(f"{path}.cache_control", block["cache_control"])
        if kind == "text":
            _check_text(f"{path}.text", block["text"])
        elif kind == "tool_use":
            self.check_tool_use(path, block, role)
        elif kind == "tool_result":
            self.check_tool_result(path, block, role)
        elif kind in ("image", "document"):
            self.check_media(path, block, role)
        elif kind in ("thinking", "redacted_thinking"):
            self.check_thinking_block(path, block, role)

    def check_media(self, path: str, block: dict, role: str) -> None:
        # Only the user (or a tool result) shows the model pictures and files.
        kind = block["type"]
        if role == "assistant":
            raise _Invalid(f"{path.rsplit('.', 1)[0]}: '{kind}' blocks are not permitted "
                           "within assistant turns.")
        if kind != "image":
            return
        source, spath = block["source"], f"{path}.image.source"
        _need_dict(spath, source)
        stype = source.get("type")
        if stype not in ("base64", "url", "file"):
            raise _Invalid(f"{spath}: Unable to extract tag using discriminator 'type'")
        if stype == "base64":
            if source.get("media_type") not in _IMAGE_TYPES:
                raise _Invalid(f"{spath}.base64.media_type: Input should be 'image/jpeg', "
                               "'image/png', 'image/gif' or 'image/webp'")
            if not isinstance(source.get("data"), str):
                raise _Invalid(f"{spath}.base64.data: Input should be a valid string")
            if not source["data"]:
                raise _Invalid(f"{spath}.base64: image cannot be empty")
        field = {"url": "url", "file": "file_id"}.get(stype)
        if field and (not isinstance(source.get(field), str) or not source[field]):
            raise _Invalid(f"{spath}.{stype}.{field}: Input should be a valid string")

    def check_thinking_block(self, path: str, block: dict, role: str) -> None:
        # Thinking is the model's own: a user turn cannot carry it (worded like
        # the refusal of images in assistant turns).  The signature is what
        # lets the API trust a thinking block sent back, so it must be a string.
        kind = block["type"]
        if role != "assistant":
            raise _Invalid(f"{path.rsplit('.', 1)[0]}: '{kind}' blocks are not permitted "
                           f"within {role} turns.")
        fields = ("thinking", "signature") if kind == "thinking" else ("data",)
        for field in fields:
            if not isinstance(block[field], str):
                raise _Invalid(f"{path}.{kind}.{field}: Input should be a valid string")

    def check_tool_use(self, path: str, block: dict, role: str) -> None:
        if role != "assistant":
            raise _Invalid(f"{path}: tool_use blocks can only appear in assistant messages")
        tid = block["id"]
        _check_tool_id(f"{path}.tool_use.id", tid)
        if tid in self.seen_ids:
            raise _Invalid(f"{path}: tool_use ids must be unique, found {tid} twice")
        self.seen_ids.add(tid)
        name = block["name"]
        if not isinstance(name, str) or not _USED_NAME.match(name):
            raise _Invalid(f"{path}.tool_use.name: String should match pattern '{_USED_NAME.pattern}'")
        _need_dict(f"{path}.tool_use.input", block["input"])

    def check_tool_result(self, path: str, block: dict, role: str) -> None:
        if role != "user":
            raise _Invalid(f"{path}: tool_result blocks can only appear in user messages")
        _check_tool_id(f"{path}.tool_result.tool_use_id", block["tool_use_id"])
        if "is_error" in block and not isinstance(block["is_error"], bool):
            raise _Invalid(f"{path}.is_error: Input should be a valid boolean")
        content = block.get("content")
        if content is None or isinstance(content, str):
            return
        if not isinstance(content, list):
            raise _Invalid(f"{path}.content: Input should be a valid string or list")
        for k, inner in enumerate(content):
            ipath = f"{path}.content.{k}"
            _need_dict(ipath, inner)
            if inner.get("type") not in _RESULT_BLOCKS:
                raise _Invalid(f"{ipath}.type: Input should be 'text', 'image', 'document' "
                               "or 'search_result'")
            self.check_block(ipath, inner, role)

    def check_turn_order(self, messages: list) -> None:
        if messages[0]["role"] != "user":
            raise _Invalid('messages: first message must use the "user" role')
        # The real API merges repeated roles; this project promises strict
        # alternation, so a doubled role means the loop lost a turn. System
        # messages stand between turns and take no part in it.
        turns = [m for m in messages if m["role"] != "system"]
        for prev, msg in zip(turns, turns[1:]):
            if prev["role"] == msg["role"]:
                raise _Invalid('messages: roles must alternate between "user" and '
                               f'"assistant", but found multiple "{msg["role"]}" roles in a row')

    def check_tool_pairing(self, messages: list, i: int) -> None:
        # Every tool call must be answered in the very next user turn, and
        # every answer must point at a call from the turn right before it.
        msg = messages[i]
        if msg["role"] == "assistant":
            uses = _block_ids(msg, "tool_use", "id")
            after = messages[i + 1] if i + 1 < len(messages) else {"content": []}
            answered = set(_block_ids(after, "tool_result", "tool_use_id"))
            missing = [u for u in uses if u not in answered]
            if missing:
                raise _Invalid(f"messages.{i}: tool_use ids were found without tool_result "
                               f"blocks immediately after: {', '.join(missing)}. Each tool_use "
                               "block must have a corresponding tool_result block in the next message.")
            return
        before = messages[i - 1] if i > 0 else {"content": []}
        asked = set(_block_ids(before, "tool_use", "id"))
        answered = set()
        for j, rid in enumerate(_block_ids(msg, "tool_result", "tool_use_id")):
            # Results lead the turn, so j is also the block's index.
            if rid in answered:
                raise _Invalid(f"messages.{i}.content.{j}: each tool_use must have a single "
                               f"result. Found multiple `tool_result` blocks with id: {rid}")
            answered.add(rid)
            if rid not in asked:
                raise _Invalid(f"messages.{i}.content.{j}: unexpected tool_use_id found in "
                               f"tool_result blocks: {rid}. Each tool_result block must have "
                               "a corresponding tool_use block in the previous message.")


def _block_ids(msg: dict, kind: str, key: str) -> list:
    content = msg.get("content", [])      # a system message may have none
    if isinstance(content, str):
        return []
    return [b[key] for b in content if b.get("type") == kind]


# --------------------------------------------------------------------------
# Building answers: the Message JSON and its streamed (SSE) form.
# --------------------------------------------------------------------------

def _estimate(obj) -> int:
    # ~4 characters per token is the usual rule of thumb; good enough for a
    # loop that only needs counts that grow with the conversation.
    return max(1, len(json.dumps(obj)) // 4)


# The prompt cache as the API documents it (Anthropic's prompt caching page), the
# one place the tests and the benchmarks take it from:
#   - The cached prefix is the request in the order tools, system, messages, block
#     by block; cache_control marks a breakpoint (at most 4; a top-level
#     cache_control puts one on the last block). The marks themselves are not
#     part of the prefix.
#   - A write happens only at a breakpoint: one entry, the prefix ending at that
#     block. A prefix shorter than the model's minimum cacheable length is not
#     cached at all (no write, no error).
#   - A read looks backward from each breakpoint, one block at a time, for a
#     prefix an earlier request wrote: at most 20 positions, the breakpoint itself
#     the first. The longest prefix so found over all breakpoints is read; from
#     there to the last breakpoint is written; the rest is plain input.
#   - A change of tool_choice or of the thinking settings invalidates the entries of
#     the message blocks (tools and system stay cached): their keys include both.
#   - Entries belong to one model. The 5-minute TTL (refreshed by each read) is
#     left out: a scripted session is far shorter.
#   - Billing: cache writes 1.25x the input price, reads 0.1x (the 5-minute TTL).
CACHE_LOOKBACK = 20          # blocks a breakpoint looks back, itself the first
CACHE_READ, CACHE_WRITE = 0.10, 1.25   # x the input price
# Minimum cacheable prefix in tokens, first matching id prefix wins (the docs'
# table; ids it does not name take the row of their family's newest model).
_MIN_CACHEABLE = (
    ("claude-opus-4-0", 1024), ("claude-opus-4-1", 1024), ("claude-opus-4-2", 1024),
    ("claude-opus", 4096),                        # Opus 4.5 and later
    ("claude-haiku-3", 2048), ("claude-3-haiku", 2048), ("claude-3-5-haiku", 2048),
    ("claude-haiku", 4096),                       # Haiku 4.5 and later
)
DEFAULT_MIN_CACHEABLE = 1024                      # Sonnet, and made-up test ids


def min_cacheable(model) -> int:
    """Tokens a prefix needs before the API caches it, for a model id."""
    return next((n for prefix, n in _MIN_CACHEABLE if str(model).startswith(prefix)),
                DEFAULT_MIN_CACHEABLE)


class PromptCache:
    """The API's prompt cache, by prefix, so usage reports what caching did
    (the rules above). account() bills one request and remembers its writes."""

    def __init__(self):
        self.written = set()

    def account(self, body: dict) -> tuple[int, int]:
        """(cache_read, cache_creation) tokens for this request; remembers its writes."""
        units, marks = _cache_units(body)
        sizes, keys, chars = [], [], 0
        digest = hashlib.sha1(json.dumps(body.get("model")).encode())
        settings = json.dumps([body.get("tool_choice") or {"type": "auto"}, body.get("thinking")], sort_keys=True)
        for unit in units:   # a running hash: the key of each prefix in one pass
            text = json.dumps(unit, sort_keys=True)
            if unit[0] not in ("tool", "system") and settings:   # the first message block: from here the
                digest.update(settings.encode())                   # keys depend on tool_choice and thinking
                settings = ""
            digest.update(text.encode())
            chars += len(text)
            sizes.append(chars // 4)
            keys.append(digest.hexdigest())
        read = 0
        for mark in marks:
            hit = next((j for j in range(mark, max(-1, mark - CACHE_LOOKBACK), -1)
                        if keys[j] in self.written), None)
            if hit is not None:
                read = max(read, sizes[hit])
        least = min_cacheable(body.get("model"))
        self.written.update(keys[i] for i in marks if sizes[i] >= least)
        last = max((i for i in marks if sizes[i] >= least), default=-1)
        return read, max(0, (sizes[last] if last >= 0 else 0) - read)


def priced(usage: dict) -> float:
    """One request's input in tokens at the input price: writes 1.25x, reads 0.1x."""
    return (usage["input_tokens"] + CACHE_READ * usage["cache_read_input_tokens"]
            + CACHE_WRITE * usage["cache_creation_input_tokens"])


def _cache_units(body: dict) -> tuple[list, list]:
    """The request as cacheable units without cache_control, and the breakpoint indices."""
    units, marks = [], []
    system = body.get("system") or []
    blocks = [("tool", t) for t in body.get("tools") or []]
    blocks += [("system", b) for b in ([{"type": "text", "text": system}] if isinstance(system, str) else system)]
    for i, m in enumerate(body.get("messages") or []):
        content = m.get("content", [])
        content = content if isinstance(content, list) else [{"type": "text", "text": content}]
        blocks += [(f"{m['role']}{i}", b) for b in content]
    for kind, block in blocks:
        if isinstance(block, dict) and "cache_control" in block:
            marks.append(len(units))
            block = {k: v for k, v in block.items() if k != "cache_control"}
        units.append([kind, block])
    if "cache_control" in body and units and (not marks or marks[-1] != len(units) - 1):
        marks.append(len(units) - 1)   # automatic caching: the last block is a breakpoint
    return units, marks


def _message(step: dict, body: dict, raw_len: int, cache=(0, 0)) -> dict:
    """The complete Message object a non-streaming request would get."""
    # A step that scripts input_tokens scripts the whole bill: no simulated cache.
    read, write = (0, 0) if "input_tokens" in step["usage"] else cache
    usage = {"input_tokens": max(1, prompt_tokens(raw_len) - read - write),
             "output_tokens": _estimate(step["content"]),
             "cache_read_input_tokens": read, "cache_creation_input_tokens": write}
    usage.update(step["usage"])
    return {"id": _new_id("msg"), "type": "message", "role": "assistant",
            "model": body.get("model"), "content": step["content"],
            "stop_reason": step["stop_reason"], "stop_sequence": None, "usage": usage}


def _pieces(s: str, size: int) -> list[str]:
    return [s[k:k + size] for k in range(0, len(s), size)]


def _block_events(index: int, block: dict) -> list:
    """content_block_start / *_delta / content_block_stop for one block.

    Like the real stream, a block starts empty and its payload arrives as
    deltas; the SDK glues them back together.
    """
    kind = block["type"]
    if kind == "text":
        start = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"], 12)]
    elif kind == "tool_use":
        start = {**block, "input": {}}
        raw = json.dumps(block["input"])            # arrives as partial JSON
        deltas = [{"type": "input_json_delta", "partial_json": p}
                  for p in _pieces(raw, max(1, -(-len(raw) // 3)))]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(block["thinking"], 12)]
        deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
    else:                                           # anything else: sent whole
        start, deltas = block, []
    events = [("content_block_start", {"type": "content_block_start", "index": index,
                                       "content_block": start})]
    events += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                        "delta": d}) for d in deltas]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def _stream_events(message: dict) -> list:
    """The exact event sequence of a real streamed response, as (name, data)."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None,
             "usage": {**usage, "output_tokens": 1}}   # real streams start at 1
    events = [("message_start", {"type": "message_start", "message": start}),
              ("ping", {"type": "ping"})]
    for index, block in enumerate(message["content"]):
        events += _block_events(index, block)
    events.append(("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": usage["output_tokens"]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


# --------------------------------------------------------------------------
# HTTP plumbing.
# --------------------------------------------------------------------------

class _Handler(http.server.BaseHTTPRequestHandler):
    # HTTP/1.1 gives keep-alive (the SDK pools connections) and chunked
    # streaming, which is what makes a cut stream detectable: without the
    # final zero-length chunk the client knows the body is incomplete.
    protocol_version = "HTTP/1.1"
    # A streamed reply is many small writes: with Nagle's algorithm on, each waits
    # for the client's delayed ACK (~40 ms a reply), as no real server makes it wait.
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:       # keep test output clean
        pass

    def do_POST(self) -> None:
        self.server.api._serve(self)

    # A request is in flight from its first line to the end of its answer (an idle
    # keep-alive connection is not): see ScriptedAPI.settle.
    def parse_request(self) -> bool:
        if not getattr(self, "_counted", False):
            self._counted = True
            self.server.api._in_flight(+1)
        return super().parse_request()

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        finally:
            if getattr(self, "_counted", False):
                self._counted = False
                self.server.api._in_flight(-1)

    do_GET = do_PUT = do_DELETE = do_PATCH = do_POST

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send_json(self, status: int, payload: dict, headers=None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", _new_id("req"))
        for name, value in (headers or {}).items():
            self.send_header(name, str(value))
        self.end_headers()
        self.wfile.write(data)

    def send_stream(self, events: list, delay: float, cut_after) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("request-id", _new_id("req"))
        self.end_headers()
        for n, (name, data) in enumerate(events):
            if cut_after is not None and n >= cut_after:
                return self.drop()
            if n and delay:
                time.sleep(delay)
            frame = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            # One chunk per event, flushed at once: the client sees each event
            # as soon as it is "generated", exactly like a live stream.
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            self.wfile.flush()
        if cut_after is not None:                   # cut after the last event
            return self.drop()
        self.wfile.write(b"0\r\n\r\n")              # the proper end of the body

    def drop(self) -> None:
        """Abruptly end the connection: no response, or no end of one."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True        # a stuck client never blocks interpreter exit

    def handle_error(self, request, client_address) -> None:
        # Clients vanishing mid-response (tests that stop reading a stream)
        # are expected here; don't spray tracebacks over the test output.
        pass


class ScriptedAPI:
    """A local Messages API that answers from a script of steps."""

    def __init__(self):
        self._lock = threading.Lock()
        self._steps: list = []
        self._log: list = []
        self._invalid: list = []     # every refused request, kept across reset()
        self.exhausted = 0
        self.left_early = 0          # streamed answers the client hung up on before their end
        self.cache = PromptCache()
        self._busy = 0               # requests being served
        self._server = None
        self._thread = None
        self.url = None

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> "ScriptedAPI":
        # Port 0: the OS picks a free port, so parallel test runs never clash.
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.api = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="fake-anthropic-api", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "ScriptedAPI":
        return self.start() if self._server is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- script and log ------------------------------------------------------

    def script(self, steps) -> None:
        with self._lock:
            self._steps = list(steps)

    def add(self, *steps) -> None:
        with self._lock:
            self._steps.extend(steps)

    def reset(self, full: bool = False) -> None:
        """Empty the script, the log and the cache, for a fresh conversation.

        Refused requests survive unless `full`: a test that resets midway
        must still answer for a bad request it sent before.  The fixtures
        start each test with a full reset.
        """
        with self._lock:
            self._steps, self._log, self.exhausted, self.left_early = [], [], 0, 0
            self.cache = PromptCache()
            if full:
                self._invalid = []

    @property
    def requests(self) -> list:
        with self._lock:
            return list(self._log)      # a snapshot: safe to iterate

    def invalid(self) -> list:
        """The refused requests, in order, including those before a reset()."""
        with self._lock:
            return list(self._invalid)

    def remaining(self) -> int:
        with self._lock:
            return len(self._steps)

    def _in_flight(self, change: int) -> None:
        with self._lock:
            self._busy += change

    def settle(self, wait: float = 30) -> None:
        """Until no request is in flight, for 0.2 s on end: a killed client's last
        request has been served or dropped, so it cannot take a step scripted for
        the next client. (The quiet time covers a request whose bytes arrived but
        whose first line the server's thread has not read yet.)"""
        deadline, quiet = time.monotonic() + wait, None
        while quiet is None or time.monotonic() - quiet < 0.2:
            with self._lock:
                busy = self._busy > 0
            quiet = None if busy else quiet or time.monotonic()
            assert time.monotonic() < deadline, f"a request to the scripted API was still in flight after {wait} s"
            time.sleep(0.005)

    # -- serving one request -------------------------------------------------

    def _serve(self, handler: _Handler) -> None:
        raw = handler.read_body()
        if len(raw) < int(handler.headers.get("Content-Length") or 0):
            return handler.drop()   # the client died mid-request: nothing arrived to judge
        entry = self._record(handler, raw)
        problem = self._reject(handler, entry, raw)
        if problem:
            status, message = problem
            entry.update(valid=False, error=message)
            with self._lock:
                self._invalid.append(entry)
            return handler.send_json(status, _error_body(status, message))
        body = entry["body"]
        if handler.path.split("?")[0].endswith("/count_tokens"):
            return handler.send_json(200, {"input_tokens": prompt_tokens(len(raw))})
        step = self._next_step(body)
        entry["step"] = step
        self._answer(handler, step, body, len(raw), entry)
        # When the last byte left: a client that shows text before this moment
        # is streaming for real, whatever the machine's speed.
        entry["done_at"] = time.monotonic()

    def _record(self, handler: _Handler, raw: bytes) -> dict:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        entry = {"path": handler.path, "headers": {k.lower(): v for k, v in handler.headers.items()},
                 "body": body, "valid": True, "error": None, "step": None}
        with self._lock:
            self._log.append(entry)
        return entry

    def _reject(self, handler: _Handler, entry: dict, raw: bytes):
        """(status, message) if the request must be refused, else None."""
        headers = entry["headers"]
        if "x-api-key" not in headers and "authorization" not in headers:
            return 401, "x-api-key header is required"
        path = handler.path.split("?")[0]
        if handler.command != "POST" or path not in ("/v1/messages", "/v1/messages/count_tokens"):
            return 404, f"Not found: {handler.command} {path}"
        if entry["body"] is None:
            return 400, "There was an error parsing the body" if raw else "Body required"
        betas = [b.strip() for b in headers.get("anthropic-beta", "").split(",") if b.strip()]
        try:
            _RequestCheck(entry["body"], count_only=path.endswith("/count_tokens"),
                          raw_len=len(raw), betas=betas).run()
        except _Invalid as exc:
            return 400, str(exc)
        return None

    def _next_step(self, body: dict) -> dict:
        with self._lock:
            if not self._steps:
                self.exhausted += 1
                # Finish the client's loop quietly; the test asserts on
                # .exhausted rather than on a confusing error deep inside.
                return reply("(script exhausted)")
            step = self._steps.pop(0)
        # Callables run outside the lock so they may inspect or extend the API.
        step = step(body) if callable(step) else step
        return reply(step) if isinstance(step, str) else step

    def _answer(self, handler: _Handler, step: dict, body: dict, raw_len: int, entry: dict) -> None:
        kind = step["kind"]
        if kind == "hangup":
            return handler.drop()
        if kind == "error":
            return handler.send_json(step["status"], step["body"], step["headers"])
        with self._lock:   # the cache is shared by concurrent requests
            cache = self.cache.account(body)
        message = _message(step, body, raw_len, cache)
        entry["usage"] = message["usage"]   # the bill as sent: benchmarks price it
        if body.get("stream"):
            try:
                return handler.send_stream(_stream_events(message), step["delay"], step["cut_after"])
            except (BrokenPipeError, ConnectionResetError):  # an interrupt or a timeout cut it
                with self._lock:
                    self.left_early += 1
                return None
        if step["delay"]:
            time.sleep(step["delay"])           # lets tests provoke timeouts
        handler.send_json(200, message)


if __name__ == "__main__":
    # Serve an empty script by hand, e.g. to poke at it with curl.
    with ScriptedAPI() as api:
        print(f"fake Messages API on {api.url} (Ctrl-C to stop)")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
