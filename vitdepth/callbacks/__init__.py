from vitdepth.callbacks.rank_collapse import RankCollapseCallback

__all__ = ["RankCollapseCallback"]
