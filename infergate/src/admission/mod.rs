//! Admission: who may send (client keys), how much (per-key limits) and when (each pool's wait queue).

pub mod fair_queue;
pub mod keys;
pub mod limits;
