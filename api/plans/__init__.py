"""Plans: what a job spec needs on a box, before anything runs."""
