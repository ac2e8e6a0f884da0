"""What a run leaves on disk: the run folder, its report.html, and Perfetto timelines."""
