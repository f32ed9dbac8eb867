mod common;
mod conformance;

conformance::conformance_suite!(dblock::Sqlite);
