"""Prefill/decode disaggregation in the engine: the scheduler side of vLLM 0.33's NIXL
connector in pull mode (connector.py) and the timing of its transfers (worker.py)."""

from engine.pd.connector import PDConnector
from engine.pd.worker import PDTransfer, PDWorker

__all__ = ["PDConnector", "PDTransfer", "PDWorker"]
