pub mod node_cases;
