//! Converter.
