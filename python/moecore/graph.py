"""Bucketed capture and replay of a FusedMoE layer, shaped like an engine's CUDA-graph runner.

An engine captures its MoE layer once per batch-size bucket and serves a batch of T tokens
from the smallest bucket that holds it, padding the rest. ``MoeGraphRunner`` does the same on
CPU over :class:`moecore.CapturedForward` (one per bucket)::

    graphs = moecore.MoeGraphRunner(layer, bucket_sizes=[1, 2, 4, 8, 16])
    graphs.capture()                                         # after the weights are loaded
    out = graphs.forward(hidden_states, router_logits)      # copy in, replay, copy out

or, without copies, the engine way::

    graph = graphs.graph_for(num_tokens)                     # the smallest bucket >= T
    graph.hidden_states[:T] = x; graph.router_logits[:T] = logits
    graph.replay(T)
    y = graph.output[:T]                                     # valid until the next replay

Replay allocates nothing and equals ``layer.forward`` on the real rows bit for bit.

An :class:`moecore.ExpertParallelGroup` captures the same way (one
:class:`moecore.CapturedGroupForward` per bucket, every rank padded to the bucket of the
largest rank's batch, as engines pad their data-parallel ranks); ``forward`` then takes and
returns one array per rank::

    graphs = moecore.MoeGraphRunner(group, bucket_sizes=[1, 2, 4, 8]).capture()
    outs = graphs.forward([x0, x1], [logits0, logits1])     # == group.forward(..., False)
"""

from __future__ import annotations

import bisect
import threading
from typing import Iterable, Optional

import numpy as np

from . import _moecore
from .errors import InvalidArgumentError, OutOfRangeError

__all__ = ["MoeGraphRunner"]


class MoeGraphRunner:
    """Captures ``layer`` (a FusedMoE, or an ExpertParallelGroup) for each bucket size when
    ``capture()`` is called (``input`` 'router_logits' or 'topk'; ``dtype`` the activation
    dtype, default the layer's params dtype; a group's dispatchers take bf16)."""

    def __init__(self, layer, bucket_sizes: Iterable[int], *, input: str = "router_logits",
                 dtype=None):
        sizes = sorted(set(int(b) for b in bucket_sizes))
        if not sizes:
            raise InvalidArgumentError("MoeGraphRunner: expected at least one bucket size")
        if sizes[0] < 1:
            raise InvalidArgumentError(
                f"MoeGraphRunner: bucket sizes must be >= 1, got {sizes[0]}")
        if input not in ("router_logits", "topk"):
            raise InvalidArgumentError(
                f"MoeGraphRunner: input must be 'router_logits' or 'topk', got {input!r}")
        self.expert_parallel = isinstance(layer, _moecore.ExpertParallelGroup)
        dtype_name = dtype if dtype is None or isinstance(dtype, str) else np.dtype(dtype).name
        if self.expert_parallel and dtype_name not in (None, "bf16", "bfloat16"):
            raise InvalidArgumentError(
                f"MoeGraphRunner: an expert-parallel group dispatches bf16 hidden states, got "
                f"dtype {dtype!r}")
        self.layer = layer
        self.input = input
        self.dtype = dtype
        self.bucket_sizes = sizes
        self.graphs: dict = {}
        self._lock = threading.Lock()

    def capture(self) -> "MoeGraphRunner":
        """Captures every bucket (allocating its buffers, workspace and schedule). Call after
        process_weights_after_loading; capturing again replaces the graphs."""
        if self.expert_parallel:
            graphs = {b: self.layer.capture(b, input=self.input) for b in self.bucket_sizes}
        else:
            graphs = {b: _moecore.CapturedForward(self.layer, b, input=self.input,
                                                  dtype=self.dtype)
                      for b in self.bucket_sizes}
        with self._lock:
            self.graphs = graphs
        return self

    def can_run(self, num_tokens: int) -> bool:
        return 0 <= num_tokens <= self.bucket_sizes[-1]

    def bucket_for(self, num_tokens: int) -> int:
        """The smallest bucket size >= num_tokens."""
        if not self.can_run(num_tokens):
            raise OutOfRangeError(
                f"MoeGraphRunner: {num_tokens} tokens do not fit the largest bucket "
                f"({self.bucket_sizes[-1]}); capture a larger bucket or run the layer eagerly")
        return self.bucket_sizes[bisect.bisect_left(self.bucket_sizes, num_tokens)]

    def graph_for(self, num_tokens: int):
        """The CapturedForward (a group's CapturedGroupForward) of the smallest bucket >=
        num_tokens."""
        bucket = self.bucket_for(num_tokens)
        if not self.graphs:
            raise InvalidArgumentError("MoeGraphRunner: call capture() before replaying")
        return self.graphs[bucket]

    def forward(self, hidden_states, router_logits=None, *, topk_ids=None, topk_weights=None):
        """Copies a batch into its bucket's static buffers, replays, and returns a copy of the
        real rows' output (for a group: lists with one entry per rank, and a list of outputs).
        Safe to call from several threads (calls take turns)."""
        if self.input == "router_logits":
            if router_logits is None or topk_ids is not None or topk_weights is not None:
                raise InvalidArgumentError(
                    "MoeGraphRunner.forward: this runner was captured for router_logits; pass "
                    "router_logits only")
            inputs = {"hidden_states": hidden_states, "router_logits": router_logits}
        else:
            if topk_ids is None or topk_weights is None or router_logits is not None:
                raise InvalidArgumentError(
                    "MoeGraphRunner.forward: this runner was captured for a top-k input; pass "
                    "topk_ids and topk_weights")
            inputs = {"hidden_states": hidden_states, "topk_ids": topk_ids,
                      "topk_weights": topk_weights}
        if not self.expert_parallel:
            rows = {name: np.asarray(value) for name, value in inputs.items()}
            t = self._num_tokens(rows["hidden_states"])
            graph = self.graph_for(t)
            self._check(graph, rows, t)
            with self._lock:
                self._fill(graph, rows, t)
                graph.replay(t)
                return graph.output[:t].copy()
        ranks = self.layer.size
        per_rank = []
        for name, values in inputs.items():
            if not isinstance(values, (list, tuple)) or len(values) != ranks:
                raise InvalidArgumentError(
                    f"MoeGraphRunner.forward: expected {name} as a list of {ranks} arrays (one "
                    f"per rank)")
        for r in range(ranks):
            per_rank.append({name: np.asarray(values[r]) for name, values in inputs.items()})
        counts = [self._num_tokens(rows["hidden_states"]) for rows in per_rank]
        graph = self.graph_for(max(counts))
        for rank_graph, rows, t in zip(graph.ranks, per_rank, counts):
            self._check(rank_graph, rows, t)  # every rank before any static buffer changes
        with self._lock:
            for rank_graph, rows, t in zip(graph.ranks, per_rank, counts):
                self._fill(rank_graph, rows, t)
            graph.replay(counts)
            return [rank_graph.output[:t].copy() for rank_graph, t in zip(graph.ranks, counts)]

    @staticmethod
    def _num_tokens(hidden_states) -> int:
        if hidden_states.ndim != 2:
            raise InvalidArgumentError(
                f"MoeGraphRunner.forward: expected hidden_states [T, H], got shape "
                f"{hidden_states.shape}")
        return hidden_states.shape[0]

    @staticmethod
    def _check(graph, rows, t) -> None:
        """Checks each input against its static buffer's shape and dtype."""
        for name, value in rows.items():
            static = getattr(graph, name)
            if value.shape != (t,) + static.shape[1:]:
                raise InvalidArgumentError(
                    f"MoeGraphRunner.forward: expected {name} of shape "
                    f"{(t,) + static.shape[1:]}, got {value.shape}")
            if value.dtype != static.dtype:
                raise InvalidArgumentError(
                    f"MoeGraphRunner.forward: expected {name} of dtype {static.dtype}, got "
                    f"{value.dtype}")

    @staticmethod
    def _fill(graph, rows, t) -> None:
        """Copies each (checked) input into the first t rows of its static buffer."""
        for name, value in rows.items():
            getattr(graph, name)[:t] = value
