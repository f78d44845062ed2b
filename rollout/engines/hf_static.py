"""The HF engine's static decode state: a KV cache of fixed shape and the decode step over it,
captured as CUDA graphs on a GPU.

A decode batch is padded up to a batch bucket (powers of two up to the engine's max_batch_size) and
its cache sized to a length bucket (a multiple of 128 tokens), so the same few shapes come back call
after call. For each (batch bucket, capacity) one `StaticDecodeState` holds:

- `SlotCache`: per layer keys/values [B, KV heads, capacity, head_dim]. Each row writes the step's
  key/value at its own slot (column): a row's prompt fills columns 0..W-1 (left-padded to its
  call's width W), and its step t writes column W + t. One call's rows share W and so the slot
  (`decode_static`); rows of a running batch joined at different steps do not
  (hf_static_batch.py). The slots are a device tensor, so a captured graph reads their current
  values.
- input buffers (the step's token and position per row, the prompt's padding mask, each row's W);
  the attention mask [B, 1, 1, L] is computed from them inside the step: prompt tokens that are not
  padding, plus the row's decode columns up to its slot. In one call, finished rows stay in the
  batch with their mask as it is: their tokens are ignored, nothing is cut out of the cache.
- on CUDA, one graph per view length L (128, 256, 512, ... up to the capacity) and per kind of
  step (recording the MoE routers' choices or not: rollout routing replay): the step at slot s
  replays the smallest graph whose view holds s, so attention reads the cache written so far, not
  all of it. Graphs are captured the first time a length is reached and reused by later calls;
  weights are loaded by copying into the parameters the graphs read. (Each graph has its own
  memory pool: an engine asked both with and without records holds both sets.)

The step calls the transformers model itself (its own kernels, 4D-mask path), so a model type is
admitted only where that path is known to hold: full attention in every layer (`supports`).

MoE models (Qwen3-MoE): transformers' default experts kernel (grouped_mm) copies from the host
inside its forward, which a CUDA graph cannot capture; the step runs the experts as batched
matmuls over each token's chosen experts instead (transformers' "batched_mm" experts, the prefill
keeps the default). That gathers batch x top-k experts' weights per layer and step, so the static
path takes an MoE model only while that gather stays under MOE_GATHER_LIMIT at the engine's
max_batch_size (small batches, where launch overhead, not weight reads, bounds a decode step).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ...core import moe_routing
from . import hf_step_attention as step_attention

CAPACITY_STEP = 128
"""Cache capacities and graph view lengths are multiples of this many tokens."""
MAX_STATES = 3
"""Decode states (batch bucket x capacity) kept at once; the least recently used is freed first."""
MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe")
"""Model types whose attention runs on a 4D mask and a cache's `update` alone (each checked on CPU
against the eager loop, tests/unit/rollout/test_hf_decode.py)."""


MOE_GATHER_LIMIT = 2**30
"""Bytes of expert weights one MoE layer's captured step may gather (batch x top-k experts)."""
CAPTURED_EXPERTS = "batched_mm"
"""transformers' experts implementation inside the static step (no host copy: capturable)."""


def experts_gather_bytes(config: Any, batch: int, dtype_bytes: int) -> int:
    """The expert weights one MoE layer's step gathers: each row's top-k experts (gate, up, down)."""
    per_expert = 3 * config.hidden_size * config.moe_intermediate_size
    return batch * config.num_experts_per_tok * per_expert * dtype_bytes


def supports(config: Any, batch: int = 1, dtype_bytes: int = 2) -> str | None:
    """Why the static path cannot run this model at `batch` rows (None: it can)."""
    if config.model_type not in MODEL_TYPES:
        return f"model type {config.model_type} is not one of {', '.join(MODEL_TYPES)}"
    if getattr(config, "num_experts", 0):
        gather = experts_gather_bytes(config, batch, dtype_bytes)
        if gather > MOE_GATHER_LIMIT:
            return (
                f"its captured step would gather {gather / 2**30:.1f} GiB of expert weights per layer at "
                f"max_batch_size {batch} (limit {MOE_GATHER_LIMIT / 2**30:.0f} GiB); a smaller "
                "max_batch_size decodes in CUDA graphs"
            )
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "layers other than full attention"
    return None


def batch_bucket(rows: int, max_batch_size: int) -> int:
    """The smallest power of two >= rows, at most max_batch_size (rows <= max_batch_size)."""
    return min(1 << (rows - 1).bit_length(), max_batch_size)


def round_up(length: int) -> int:
    return -(-length // CAPACITY_STEP) * CAPACITY_STEP


class SlotCache:
    """The KV cache the model's attention layers call `update` on: the step's keys and values go to
    `slot`, and attention sees the first `view_len` positions (a narrowed view, no copy)."""

    def __init__(self, config: Any, batch: int, capacity: int, dtype: torch.dtype, device: torch.device):
        heads = config.num_key_value_heads or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (batch, heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.values = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)
        ]
        self.slot_B = torch.zeros(batch, dtype=torch.long, device=device)
        """The column each row writes the step's key and value to."""
        self._slot_BH1D = self.slot_B.view(batch, 1, 1, 1).expand(shape[0], shape[1], 1, shape[3])
        self.view_len = capacity

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.scatter_(2, self._slot_BH1D, key_states)
        values.scatter_(2, self._slot_BH1D, value_states)
        return keys[:, :, : self.view_len], values[:, :, : self.view_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are always given, so the model never derives them from the cache

    def load_prompts(self, prefill_cache: Any, n: int, width: int) -> None:
        """Rows 0..P*n-1 start from the prefill's keys and values (prompt p's in rows p*n..p*n+n-1)."""
        for layer, (keys, values) in enumerate(zip(self.keys, self.values, strict=True)):
            prompt = prefill_cache.layers[layer]
            rows = prompt.keys.shape[0] * n
            keys[:rows, :, :width].copy_(prompt.keys.repeat_interleave(n, dim=0))
            values[:rows, :, :width].copy_(prompt.values.repeat_interleave(n, dim=0))


class StaticDecodeState:
    """The cache, the step's input buffers and (CUDA) the captured steps of one (batch, capacity)."""

    def __init__(self, model: Any, batch: int, capacity: int, use_graphs: bool):
        device, dtype = model.device, model.dtype
        self.model, self.batch, self.capacity = model, batch, capacity
        self.cache = SlotCache(model.config, batch, capacity, dtype, device)
        self.tokens_B1 = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.positions_B1 = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.prompt_mask_BL = torch.zeros((batch, capacity), dtype=torch.bool, device=device)
        self.start_B = torch.zeros(batch, dtype=torch.long, device=device)
        """Each row's first decoded column (its prompt's width)."""
        self.live_B = torch.zeros(batch, dtype=torch.long, device=device)
        """1 for the rows a step advances (their slot and position), 0 for free rows."""
        self.columns_L = torch.arange(capacity, device=device)
        self.use_graphs = use_graphs
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.routes_BLK: torch.Tensor | None = None
        self._routers: list[torch.nn.Module] | None = None
        """With `record`: the experts each row's token was routed to in the last step (uint8 [B,
        MoE layers, top_k]), overwritten by the next step."""
        step_attention.register()

    def start(
        self, prefill_cache: Any, n: int, mask_PL: torch.Tensor, last_positions_P: torch.Tensor
    ) -> None:
        """Load one call's prompts: P*n rows of the batch (the rest are idle rows, stepped along)."""
        rows, width = mask_PL.shape[0] * n, mask_PL.shape[1]
        self.cache.load_prompts(prefill_cache, n, width)
        self.prompt_mask_BL.zero_()
        self.prompt_mask_BL[:rows, :width] = mask_PL.repeat_interleave(n, dim=0).bool()
        self.positions_B1.zero_()
        self.positions_B1[:rows, 0] = last_positions_P.repeat_interleave(n) + 1
        self.start_B.fill_(width)
        self.cache.slot_B.fill_(width)
        self.live_B.fill_(1)
        self.tokens_B1.zero_()

    def load_rows(
        self, prefill_cache: Any, slots_A: torch.Tensor, mask_AL: torch.Tensor, last_positions_A: torch.Tensor
    ) -> None:
        """Rows joining a running batch: row a of the prefill (its prompt left-padded to the
        prefill's width W) into slot slots_A[a], columns 0..W-1; it decodes from column W on."""
        width = mask_AL.shape[1]
        for layer, (keys, values) in enumerate(zip(self.cache.keys, self.cache.values, strict=True)):
            prompt = prefill_cache.layers[layer]
            keys[slots_A, :, :width] = prompt.keys
            values[slots_A, :, :width] = prompt.values
        self.prompt_mask_BL[slots_A] = False
        self.prompt_mask_BL[slots_A, :width] = mask_AL.bool()
        self.positions_B1[slots_A, 0] = last_positions_A + 1
        self.start_B[slots_A] = width
        self.cache.slot_B[slots_A] = width
        self.live_B[slots_A] = 1

    def free_rows(self, slots: torch.Tensor) -> None:
        """Rows that left: they stay in the step, writing to and reading column 0 alone."""
        self.prompt_mask_BL[slots] = False
        for x in (self.start_B, self.cache.slot_B, self.live_B, self.positions_B1):
            x[slots] = 0

    def take_rows(self, other: StaticDecodeState, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Rows `src` of another state (a smaller or larger one) as this state's rows `dst`, every
        column they hold (each row's columns fit the smaller of the two capacities)."""
        columns = min(self.capacity, other.capacity)
        for mine, theirs in ((self.cache.keys, other.cache.keys), (self.cache.values, other.cache.values)):
            for x, y in zip(mine, theirs, strict=True):
                x[dst, :, :columns] = y[src, :, :columns]
        self.prompt_mask_BL[dst] = False
        self.prompt_mask_BL[dst, :columns] = other.prompt_mask_BL[src, :columns]
        for x, y in (
            (self.start_B, other.start_B), (self.cache.slot_B, other.cache.slot_B),
            (self.live_B, other.live_B), (self.positions_B1, other.positions_B1),
        ):  # fmt: skip
            x[dst] = y[src]

    def step(self, token_B: torch.Tensor, top: int, record: bool = False) -> torch.Tensor:
        """Feed each row's token at its slot (`top`: the host's count of the largest slot a live
        row writes); the next logits [B, V]. The returned tensor is overwritten by the next step.
        `record`: the step also writes the experts it routed each row to into `routes_BLK` (its
        own captured graphs)."""
        self.tokens_B1.copy_(token_B[:, None])
        view_len = min(self.capacity, round_up(top + 1))
        if self.use_graphs:
            if (view_len, record) not in self.graphs:
                self.graphs[view_len, record] = self._capture(view_len, record)
            graph, logits_BV = self.graphs[view_len, record]
            graph.replay()
        else:
            logits_BV = self._forward(view_len, record)
        self.cache.slot_B += self.live_B
        self.positions_B1 += self.live_B[:, None]
        return logits_BV

    def _forward(self, view_len: int, record: bool = False) -> torch.Tensor:
        columns = self.columns_L[:view_len]
        decoded = (columns >= self.start_B[:, None]) & (columns <= self.cache.slot_B[:, None])
        mask_B11L = (self.prompt_mask_BL[:, :view_len] | decoded)[:, None, None, :]
        self.cache.view_len = view_len
        with step_implementations(self.model.config), self._recording(record):
            out = self.model(
                input_ids=self.tokens_B1, position_ids=self.positions_B1, attention_mask=mask_B11L,
                past_key_values=self.cache, use_cache=True,
            )  # fmt: skip
        return out.logits[:, -1]

    @contextmanager
    def _recording(self, record: bool) -> Iterator[None]:
        """While `record`: each MoE router's choice copied into routes_BLK (tensor copies only, so a
        captured graph replays them)."""
        if not record:
            yield
            return
        if self._routers is None:
            self._routers = moe_routing.routers(self.model)
        routers = self._routers
        if self.routes_BLK is None:
            layers, top_k = moe_routing.shape_of(self.model)
            self.routes_BLK = torch.zeros(
                (self.batch, layers, top_k), dtype=torch.uint8, device=self.tokens_B1.device
            )
        routes = self.routes_BLK

        def hook(layer: int) -> Any:
            def copy(module: torch.nn.Module, args: Any, out: tuple[torch.Tensor, ...]) -> None:
                routes[:, layer].copy_(out[2])  # returns nothing: the router's output stays as it is

            return copy

        handles = [r.register_forward_hook(hook(layer)) for layer, r in enumerate(routers)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _capture(self, view_len: int, record: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The step at view length `view_len` as a CUDA graph, after two warm-up runs on a side stream
        (as torch.cuda.graphs asks). The warm-up runs are this step itself on its real inputs: they
        write the slot's keys and values that the replay then writes again."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(view_len, record)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits_BV = self._forward(view_len, record)
        return graph, logits_BV


@contextmanager
def step_implementations(config: Any) -> Iterator[None]:
    """The model's attention as hf_step_attention's (the cache read in place) and an MoE model's
    experts as CAPTURED_EXPERTS, for the step only: transformers reads both choices from the
    config at each forward, and the prefill keeps the model's own."""
    moe = bool(getattr(config, "num_experts", 0))
    before = config._attn_implementation, config._experts_implementation if moe else None
    config._attn_implementation = step_attention.NAME
    if moe:
        config._experts_implementation = CAPTURED_EXPERTS
    try:
        yield
    finally:
        config._attn_implementation = before[0]
        if moe:
            config._experts_implementation = before[1]


class StaticDecodeStates:
    """Decode states by (batch bucket, capacity), the least recently used freed past MAX_STATES."""

    def __init__(self, model: Any, max_batch_size: int, max_model_len: int, use_graphs: bool):
        self.model, self.max_batch_size, self.max_model_len = model, max_batch_size, max_model_len
        self.use_graphs = use_graphs
        self._states: OrderedDict[tuple[int, int], StaticDecodeState] = OrderedDict()
        self.held: StaticDecodeState | None = None
        """The state a running batch's rows are in (hf_static_batch.py), none while none decode."""

    def get(self, rows: int, length: int) -> StaticDecodeState:
        """A state for `rows` rows of up to `length` tokens (prompt width + max_tokens)."""
        key = (
            batch_bucket(rows, self.max_batch_size),
            min(round_up(length), max(length, self.max_model_len)),
        )
        state = self._states.pop(key, None)
        if state is None:
            while len(self._states) >= MAX_STATES:
                self._states.popitem(last=False)
            state = StaticDecodeState(self.model, *key, self.use_graphs)
        self._states[key] = state
        return state
