"""The use case every command shares, above recipe/ and probe/ (which never import it): docs/layout.md names its
modules."""
