//! Unit tests of the roce provider.
