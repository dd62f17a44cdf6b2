"""What reads stored runs: the diff of two runs, expected divergences, history across commits."""
