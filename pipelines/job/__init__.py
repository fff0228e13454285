"""The Spark job: the streaming query and its run loops, the raw_events source, the exactly-once sink, the
stateful operators behind one seam, the Spark runtime, and the checkpoint read without Spark."""
