//! Request dispatch: Moore-Hodgson, LST-IMH and the online dispatcher (PAPER.md §6).
