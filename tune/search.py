"""The candidates `tfpipe tune` measures, coarse to fine, within a trial budget.

The start is the TF Serving batching guide's CPU starting point (num_batch_threads = cores,
batch_timeout_micros 0, a large max_enqueued_batches while experimenting) with max_batch_size
32. Then, each stage built on what the earlier ones measured:

1. coarse: max_batch_size 8/32/128 against batch_timeout_micros 0/2000/8000;
2. fine: the best pair's neighbours (half and double the batch size; the timeout halved and
   doubled, or 500 and 1000 us from 0);
3. threads: num_batch_threads 1 and twice the cores;
   workers (with `workers=True`: the embedded server, more than one core): the leader served by
   one `tfpipe serve --workers` process per core, each with its share of the batch threads and of
   max_batch_size (each worker sees that share of the requests);
4. queue: max_enqueued_batches = num_batch_threads, the guide's setting for online serving;
5. padding: allowed_batch_sizes, the powers of two up to max_batch_size;
6. confirm: the start and the leader measured once more, alternately, so that the winner is not
   just the luckiest of many single noisy measurements; then, while the budget lasts, any
   candidate that leads on one measurement alone is measured again.

A stage that would run past the budget is cut short (the confirm stage's two trials are kept
back when the budget allows). Candidates are ranked by the mean of their scores.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from tfpipe.serve.core.batching import RUN_BATCHING, BatchOptions

COARSE_SIZES = (8, 32, 128)
COARSE_TIMEOUTS = (0, 2000, 8000)
EXPLORING_QUEUE = 1000  # "temporarily set max_enqueued_batches to a really high value"
MAX_BATCH_SIZE = 1024
MAX_TIMEOUT_MICROS = 100_000


@dataclass(frozen=True)
class Candidate(BatchOptions):
    """One setting of the batching parameters (the server's own BatchOptions, queued generously
    while exploring), and the embedded server's worker processes it runs in (the parameters
    apply in each worker)."""

    max_enqueued_batches: int = EXPLORING_QUEUE
    workers: int = 1

    def label(self) -> str:
        text = (f"max_batch_size={self.max_batch_size} batch_timeout_micros={self.batch_timeout_micros} "
                f"num_batch_threads={self.num_batch_threads} max_enqueued_batches={self.max_enqueued_batches}")
        if self.allowed_batch_sizes:
            text += " allowed_batch_sizes=" + ",".join(map(str, self.allowed_batch_sizes))
        if self.workers != 1:
            text += f" workers={self.workers}"
        return text


def guide_start(cores: int) -> Candidate:
    """The guide's CPU starting point, with the rows a batch `tfpipe run` starts from (RUN_BATCHING)."""
    return Candidate(max_batch_size=RUN_BATCHING.max_batch_size, batch_timeout_micros=0,
                     num_batch_threads=max(1, cores))


def powers_of_two_up_to(n: int) -> tuple[int, ...]:
    """1, 2, 4, ... below n, then n itself (TF Serving wants the last entry to be max_batch_size)."""
    sizes, s = [], 1
    while s < n:
        sizes.append(s)
        s *= 2
    return (*sizes, n)


def _timeout_neighbours(t: int) -> list[int]:
    if t == 0:
        return [500, 1000]
    return [t // 2, min(t * 2, MAX_TIMEOUT_MICROS)]


class CoarseToFine:
    """Proposes the next candidate from what has been measured; `record` takes each score
    (higher is better; 0 when no load level met the SLO)."""

    def __init__(self, cores: int, budget: int, workers: bool = False):
        if budget < 1:
            raise ValueError("the trial budget must be at least 1")
        self.cores, self.budget = max(1, cores), budget
        self.workers = workers and self.cores > 1
        self.start = guide_start(self.cores)
        self.trials: list[tuple[str, Candidate, float]] = []  # (stage, candidate, score), in order
        self._pending: list[tuple[str, Candidate]] = [("start", self.start)]
        self._stages = iter(("coarse", "fine", "threads", *(("workers",) if self.workers else ()), "queue",
                             "padding", "confirm"))
        self._confirmed = False

    # --- what has been measured -----------------------------------------------------------
    def scores(self) -> dict[Candidate, list[float]]:
        out: dict[Candidate, list[float]] = {}
        for _, c, s in self.trials:
            out.setdefault(c, []).append(s)
        return out

    def best(self) -> Candidate:
        """The candidate with the highest mean score (the start wins ties: it is the known one)."""
        scores = self.scores()
        return max(scores, key=lambda c: (statistics.fmean(scores[c]), c == self.start))

    def record(self, stage: str, candidate: Candidate, score: float) -> None:
        self.trials.append((stage, candidate, float(score)))

    # --- what to measure next -------------------------------------------------------------
    def _reserve(self) -> int:
        """Trials kept back for the confirm stage (when the budget has room for more than that)."""
        return 0 if self._confirmed or self.budget < 5 else 2

    def _stage(self, name: str) -> list[Candidate]:
        best = self.best()
        if name == "coarse":
            grid = [Candidate(m, t, self.start.num_batch_threads) for m in COARSE_SIZES for t in COARSE_TIMEOUTS]
            # spread first: batch size at timeout 0, then timeouts, then the corners
            order = [(128, 0), (8, 0), (32, 2000), (128, 2000), (32, 8000), (128, 8000), (8, 2000), (8, 8000),
                     (32, 0)]
            return sorted(grid, key=lambda c: order.index((c.max_batch_size, c.batch_timeout_micros)))
        if name == "fine":
            sizes = [max(1, best.max_batch_size // 2), min(best.max_batch_size * 2, MAX_BATCH_SIZE)]
            return ([replace(best, max_batch_size=m) for m in sizes]
                    + [replace(best, batch_timeout_micros=t) for t in _timeout_neighbours(best.batch_timeout_micros)])
        if name == "threads":
            return [replace(best, num_batch_threads=n) for n in (1, 2 * self.cores)]
        if name == "workers":
            # each worker sees 1/N of the requests: a batch that filled in one process would wait out
            # its timeout in each of N (throughput collapses), so the batch and the batch threads
            # are divided too
            n = self.cores
            return [replace(best, workers=n, num_batch_threads=max(1, best.num_batch_threads // n),
                            max_batch_size=max(1, best.max_batch_size // n), allowed_batch_sizes=())]
        if name == "queue":
            return [replace(best, max_enqueued_batches=best.num_batch_threads)]
        if name == "padding":
            return [replace(best, allowed_batch_sizes=powers_of_two_up_to(best.max_batch_size))]
        if name == "confirm":
            self._confirmed = True
            return [self.start, best] if best != self.start else [self.start]
        raise ValueError(name)

    def propose(self) -> tuple[str, Candidate] | None:
        """(stage, candidate) to measure next, or None when the budget is spent or every stage ran."""
        measured = self.scores()
        while len(self.trials) < self.budget:
            room = self.budget - len(self.trials) - self._reserve()
            while self._pending:
                stage, c = self._pending.pop(0)
                if stage == "confirm" or (c not in measured and room > 0):
                    return stage, c
            stage = next(self._stages, None)
            if stage is None:
                best = self.best()
                # a leader on one measurement (the confirmed one fell behind it): measure it again
                return ("confirm", best) if self._confirmed and len(measured[best]) < 2 else None
            if stage != "confirm" and room <= 0:
                continue  # no room left before the confirmation: skip to it
            self._pending = [(stage, c) for c in self._stage(stage)]
        return None
