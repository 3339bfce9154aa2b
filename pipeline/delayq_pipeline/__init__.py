"""delayq data pipeline on Spark: bulk scheduling and lifecycle analytics."""
