"""Stage two: replay a pool deterministically through a learner."""
