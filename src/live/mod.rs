//! Live policy: the store that swaps compiled snapshots atomically, and the reload that
//! watches the policy directory.

pub mod debounce;
pub mod reload;
pub mod store;
pub mod watched;

pub use store::PolicyStore;
