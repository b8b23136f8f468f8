"""Search: the fastest plan that fits, in the `megatron` or the `hybrid` space (search/plan_search.py)."""
from .constraints import SearchConstraints, SearchResult
from .plan_search import search_plan

__all__ = ["search_plan", "SearchConstraints", "SearchResult"]
