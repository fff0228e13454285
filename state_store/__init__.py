"""State lifecycle library: checkpoint inspection, savepoints, restore, rescale, compaction."""
