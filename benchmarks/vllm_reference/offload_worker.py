"""The worker side of vLLM's OffloadingConnector, replaced by the spec's transfer timing model.

The scheduler side (OffloadingConnectorScheduler + CPUOffloadingManager with its lru/arc
policy) runs unmodified inside vLLM's Scheduler; this module plays the GPU worker as
offloading/worker.py + the model runner's connector hooks do, with transfer completions
computed by `transfer_model.Link`:

- stores a step's schedule() builds are deferred to the start of the next step
  (OffloadingConnectorWorker.prepare_store_kv) and submitted there (handle_preemptions);
- jobs_to_flush: each unsubmitted one is submitted at the step's start and the forward pass
  waits until all have completed (handle_preemptions -> worker.wait);
- loads are submitted after that wait, at the forward's start (start_load_kv runs after
  handle_preemptions);
- every job completed by the step's end is reported in that step's update: completed_jobs in
  an OffloadingWorkerMetadata, loads also as finished_recving (get_finished).

It also names chunks canonically ("R:C": the first request in arrival order whose prompt has
the chunk, and the chunk's index in it) and records per step what the golden files hold.
"""

from __future__ import annotations

from transfer_model import Link


class OrderedSet(set):
    """A set that iterates in a given order (set semantics otherwise)."""

    def __init__(self, items):
        super().__init__(items)
        self._order = list(items)

    def __iter__(self):
        return iter(self._order)


class OffloadSim:
    def __init__(self, scheduler, args):
        self.scheduler = scheduler
        self.conn = scheduler.connector.connector_scheduler  # OffloadingConnectorScheduler
        # With the tiering spec the CPU tier is the tiering manager's primary tier.
        self.cpu = getattr(self.conn.manager, "primary_tier", self.conn.manager)
        from offload_tier import TimedFsTier
        self.disk = TimedFsTier.INSTANCE if self.cpu is not self.conn.manager else None
        self.disk_logged = 0
        self.disk_clock: list[float] = []  # the step's schedule() and update() times, unrounded
        self.kv_bytes_per_block = args.kv_bytes_per_block
        self.link = Link(args.read_gbps * 1e9, args.write_gbps * 1e9, args.link_latency_us * 1e-6)
        self.snapshot_every = args.cpu_snapshot_every
        cfg = self.conn.config
        self.hashes_per_chunk = cfg.kv_group_configs[0].hashes_per_chunk
        self.names: dict[bytes, str] = {}
        self.deferred: list[tuple[int, int]] = []  # (job, gpu blocks) stores of the last step
        self.load_req: dict[int, str] = {}  # in-flight load job -> request
        self.tier: set[bytes] = set()
        self.last_completed = False  # did the last step's update report a completion
        self.delayed: dict[str, str] = {}  # request -> why the connector said "not yet"
        # Observe (not change) the connector's answers: a None hit count delays the request.
        connector = scheduler.connector
        lookup = connector.get_num_new_matched_tokens

        def observed_lookup(request, num_computed_tokens):
            result = lookup(request, num_computed_tokens)
            if result[0] is None:
                self.delayed[request.request_id] = self._delay_reason(request.request_id)
            return result

        connector.get_num_new_matched_tokens = observed_lookup
        # The connector walks SchedulerOutput.finished_req_ids, a set of str, to build the
        # final stores of finished requests and to tell the policy they finished: with several
        # finishing in one step, its decisions (job order, LRU ranks, evictions) would follow
        # Python's salted string hash (PYTHONHASHSEED). Any order is one vLLM could take; hand
        # it the order they finished in (the step's running order) so runs are reproducible.
        self.finish_seq: dict[str, int] = {}
        build = connector.build_connector_meta

        def ordered_build(scheduler_output):
            ids = scheduler_output.finished_req_ids
            if ids and len(ids) > 1:
                order = sorted(ids, key=lambda r: (self.finish_seq.get(r, 1 << 62), r))
                scheduler_output.finished_req_ids = OrderedSet(order)
            return build(scheduler_output)

        connector.build_connector_meta = ordered_build
        self.totals = dict(load_jobs=0, store_jobs=0, loaded_blocks=0, stored_blocks=0,
                           loaded_chunks=0, stored_chunks=0, external_hit_tokens=0,
                           flush_wait_s=0.0, cpu_evicted=0, kv_lookup_delays=0)

    # -------------------------------------------------------------- naming
    def name_request(self, req) -> None:
        """Name the prompt's full chunks not seen before (call in arrival order)."""
        from vllm.v1.kv_offload.base import make_offload_key
        hpc = self.hashes_per_chunk
        hashes = req.block_hashes
        for c in range(len(hashes) // hpc):
            key = make_offload_key(hashes[(c + 1) * hpc - 1], 0)
            self.names.setdefault(key, f"{req.request_id}:{c}")

    def name(self, key: bytes) -> str:
        return self.names.get(key) or "?" + key.hex()[:16]

    def tier_keys(self) -> set[bytes]:
        policy = self.cpu._policy
        if hasattr(policy, "chunks"):  # lru
            return set(policy.chunks)
        return set(policy.t1) | set(policy.t2)  # arc

    def _job_chunks(self, job_id: int, req_id: str) -> list[str]:
        keys = self.conn._jobs[job_id].keys
        rs = self.conn._req_status.get(req_id)
        order = {k: i for i, k in enumerate(rs.group_states[0].offload_keys)} if rs else {}
        return [self.name(k) for k in sorted(keys, key=lambda k: (order.get(k, 1 << 62), k))]

    def _delay_reason(self, req_id: str) -> str:
        """Which of get_num_new_matched_tokens's three None answers this was (checked in its
        order): the request's own jobs in flight, a hit chunk whose store is still pending
        (lookup HIT_PENDING), or a hit chunk being loaded for another request."""
        rs = self.conn._req_status[req_id]
        if rs.transfer_jobs:
            return "own_transfers_in_flight"
        gs = rs.group_states[0]
        tpc = self.conn.config.kv_group_configs[0].tokens_per_chunk
        for key in gs.offload_keys[rs.num_locally_computed_tokens // tpc:]:
            chunk = self.cpu._policy.get(key)
            if chunk is None:
                break
            if not chunk.is_ready:
                return "store_pending"
        return "chunks_being_loaded"

    # -------------------------------------------------------------- one step
    def begin_step(self, sched_out, t_start: float, rec: dict) -> float:
        """Record the step's jobs, submit what the worker submits before the forward pass.
        Returns the forward's start time (t_start, later if a flush had to wait)."""
        meta = sched_out.kv_connector_metadata
        load_jobs, store_jobs, ext, local = [], [], {}, {}
        for job_id, tj in meta.load_jobs.items():
            assert not tj.sync, "sync loads (sync_load_budget_bytes) are not modelled"
            nblocks = len(tj.dst_spec.block_ids)
            load_jobs.append({"job": job_id, "request": tj.req_id,
                              "chunks": self._job_chunks(job_id, tj.req_id), "gpu_blocks": nblocks})
            req = self.scheduler.requests[tj.req_id]
            loc = self.conn._req_status[tj.req_id].num_locally_computed_tokens
            local[tj.req_id] = loc
            ext[tj.req_id] = req.num_computed_tokens - loc
        for job_id, tj in meta.store_jobs.items():
            store_jobs.append({"job": job_id, "request": tj.req_id,
                               "chunks": self._job_chunks(job_id, tj.req_id),
                               "gpu_blocks": len(tj.src_spec.block_ids)})
        flush = set(meta.jobs_to_flush or ())
        tier = self.tier_keys()
        added, evicted = tier - self.tier, self.tier - tier
        self.tier = tier

        # handle_preemptions: last step's stores, then this step's flushed stores, then wait
        for job_id, nblocks in self.deferred:
            self.link.submit(job_id, "write", nblocks * self.kv_bytes_per_block, t_start)
        self.deferred = []
        for s in store_jobs:
            if s["job"] in flush:
                self.link.submit(s["job"], "write", s["gpu_blocks"] * self.kv_bytes_per_block,
                                 t_start)
            else:
                self.deferred.append((s["job"], s["gpu_blocks"]))
        t_fwd = self.link.wait(flush) if flush else t_start
        t_fwd = max(t_fwd, t_start)
        # start_load_kv
        for lj in load_jobs:
            self.link.submit(lj["job"], "read", lj["gpu_blocks"] * self.kv_bytes_per_block, t_fwd)
            self.load_req[lj["job"]] = lj["request"]

        t = self.totals
        t["load_jobs"] += len(load_jobs)
        t["store_jobs"] += len(store_jobs)
        t["loaded_blocks"] += sum(j["gpu_blocks"] for j in load_jobs)
        t["stored_blocks"] += sum(j["gpu_blocks"] for j in store_jobs)
        t["loaded_chunks"] += sum(len(j["chunks"]) for j in load_jobs)
        t["stored_chunks"] += sum(len(j["chunks"]) for j in store_jobs)
        t["external_hit_tokens"] += sum(ext.values())
        t["flush_wait_s"] += t_fwd - t_start
        t["cpu_evicted"] += len(evicted)
        t["kv_lookup_delays"] += len(self.delayed)
        rec.update({
            "load_jobs": load_jobs, "store_jobs": store_jobs, "jobs_to_flush": sorted(flush),
            "waiting_for_kv": [j["request"] for j in load_jobs],
            "kv_lookup_delayed": self.delayed,
            "local_hit_tokens": local, "external_hit_tokens": ext,
            # the tier gains exactly the store jobs' chunks (prepare_store inserts them as
            # pending): cpu_added is written only if that ever differs
            "cpu_evicted": sorted(self.name(k) for k in evicted),
            "cpu_num_chunks": len(tier),
        })
        self.delayed = {}
        if added != {k for j in meta.store_jobs for k in self.conn._jobs[j].keys}:
            rec["cpu_added"] = sorted(self.name(k) for k in added)
        if self.snapshot_every and rec["step"] % self.snapshot_every == 0:
            rec["cpu_chunks"] = self.cpu_chunks()
        return t_fwd

    def zero_step_end(self, t_fwd: float, next_arrival: float, built_stores: bool) -> float:
        """End of a step that scheduled no token: no compute. With submitted jobs in flight the
        clock jumps to min(next completion, next arrival); with stores just built (submitted at
        the next step's start) or nothing in flight it does not move. A disk tier's jobs count
        as in flight; its lookup probes waiting for their answers keep the clock still (the
        engine steps again at once)."""
        disk = self.disk
        if disk is not None and disk.probes_waiting():
            return t_fwd
        busy = bool(self.link.jobs) or (disk is not None and bool(disk.link.jobs))
        if built_stores or not busy:
            return t_fwd
        due = self.link.next_completion()
        if disk is not None:
            due = min(due, disk.next_completion())
        return max(t_fwd, min(due, next_arrival))

    def set_tier_clock(self, t: float) -> None:
        """The disk tier's clock: the scheduler's time at schedule() / update_from_output()."""
        if self.disk is not None:
            self.disk.now = t
            self.disk_clock.append(t)

    def record_tier(self, rec: dict) -> None:
        """The disk tier's jobs submitted and reported since the last record, what it holds."""
        disk = self.disk
        if disk is None:
            return
        jobs = []
        for e in disk.log[self.disk_logged:]:
            if e["event"] == "done":
                jobs.append({"event": "done", "job": e["job"]})
            else:
                jobs.append({"event": e["event"], "job": e["job"], "request": e["request"],
                             "chunks": [self.name(k) for k in e["keys"]]})
        self.disk_logged = len(disk.log)
        rec["disk_jobs"] = jobs
        rec["disk_clock"], self.disk_clock = self.disk_clock, []
        rec["disk_num_chunks"] = len(disk.on_disk)
        if self.snapshot_every and rec["step"] % self.snapshot_every == 0:
            rec["disk_chunks"] = sorted(self.name(k) for k in disk.on_disk)

    def end_step(self, t_poll: float, rec: dict):
        """The step's KVConnectorOutput: every job completed by t_poll (None if none)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput
        done = self.link.collect(t_poll)
        rec["completed_jobs"] = sorted(j.job_id for j in done)
        self.last_completed = bool(done)
        if not done:
            return None
        recving = {self.load_req.pop(j.job_id) for j in done if j.job_id in self.load_req}
        meta = OffloadingWorkerMetadata()
        for j in sorted(done, key=lambda j: j.job_id):
            meta.mark_completed(j.job_id)
        return KVConnectorOutput(finished_recving=recving or None, kv_connector_worker_meta=meta)

    def note_finished(self, request_ids) -> None:
        """Requests reported finished, in the order update_from_output finished them."""
        for rid in request_ids:
            self.finish_seq[rid] = len(self.finish_seq)

    def close(self) -> None:
        """The tiering spec's scheduler-side shared memory region (/dev/shm) is removed only
        by its manager's shutdown (TieringOffloadingManager.shutdown -> primary tier)."""
        if self.disk is not None:
            self.conn.manager.shutdown()

    def busy(self) -> bool:
        disk = self.disk
        if disk is not None and (disk.link.jobs or disk.probes_waiting()):
            return True
        return bool(self.link.jobs or self.deferred)

    def cpu_chunks(self) -> list[str]:
        return sorted(self.name(k) for k in self.tier_keys())

    def config_info(self, args) -> dict:
        mgr = self.cpu
        cfg = self.conn.config
        return {
            "connector": type(self.scheduler.connector).__name__,
            "manager": type(mgr).__name__,
            "eviction_policy": args.offload_policy,
            "policy_cls": type(mgr._policy).__name__,
            "cpu_bytes": args.cpu_bytes,
            "kv_bytes_per_block": args.kv_bytes_per_block,
            "blocks_per_chunk": cfg.blocks_per_chunk,
            "tokens_per_chunk": cfg.kv_group_configs[0].tokens_per_chunk,
            "num_cpu_chunks": mgr._num_chunks,
            "offload_prompt_only": cfg.offload_prompt_only,
            "supports_partial_tail": cfg.supports_partial_tail,
            "sync_load_budget_bytes": cfg.sync_load_budget_bytes,
            "store_threshold": mgr.store_threshold,
            "read_bytes_per_s": args.read_gbps * 1e9,
            "write_bytes_per_s": args.write_gbps * 1e9,
            "link_latency_s": args.link_latency_us * 1e-6,
            **({"disk_chunk_bytes": self.disk.block_size_bytes} if self.disk else {}),
            "kv_connector_extra_config": dict(
                self.scheduler.vllm_config.kv_transfer_config.kv_connector_extra_config),
        }

    def summary(self) -> dict:
        if self.disk is not None:
            self.totals["final_disk_chunks"] = sorted(self.name(k) for k in self.disk.on_disk)
        return {**self.totals, "flush_wait_s": round(self.totals["flush_wait_s"], 9),
                "final_cpu_chunks": self.cpu_chunks(),
                "jobs_unfinished": sorted(self.link.jobs) + [j for j, _ in self.deferred]}
