"""What a run leaves on disk: the run folder, its report.html, and Perfetto timelines; and the
curve.csv / curve.png folder of ``kvsim cache-curve`` (curve_folder)."""
