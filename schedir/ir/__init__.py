"""The IR machinery: the step view, the pass base and manager, text and Graphviz dumps."""
