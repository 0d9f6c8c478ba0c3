//! engine-sim: a simulated vLLM engine that is right on the wire (helper implements).
