//! (filled in by the change that defends against these attacks)
