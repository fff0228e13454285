"""The stateful operators behind one seam (`seam.StateOperator`): the JVM operator that runs, the retired Python
operator's layout that can still be read, and the registry that picks one per checkpoint."""
