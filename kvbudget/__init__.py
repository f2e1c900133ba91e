"""KVBudget: worst-case KV-cache budgeting and admission for LLM inference hosts."""

__version__ = "0.1.0"
