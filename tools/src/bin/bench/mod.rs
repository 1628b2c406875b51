//! The pieces of `sagaflow-bench`: command line, the measured saga, the figures it reads and
//! prints, and the multi-process mode.

pub(crate) mod ceiling;
pub(crate) mod cli;
pub(crate) mod console;
pub(crate) mod cpu;
pub(crate) mod figures;
pub(crate) mod fleet;
pub(crate) mod hostile;
pub(crate) mod parked;
pub(crate) mod replica;
pub(crate) mod retention;
pub(crate) mod workload;
pub(crate) mod writes;
