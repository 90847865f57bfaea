-- A job of a stored workflow may point at its version instead of carrying a
-- copy of the definition: (workflow_name, workflow_version) names an
-- immutable row of workflow_definition, so an edit (a new version) still
-- never shifts a live job. Inline definitions are still copied: they have
-- no row to point at.
--
-- Workers of this release read either form; whether they write the
-- reference is a setting (FLOTILLA_DEFINITION_BY_REFERENCE), off until no
-- older worker, which expects the copy, can claim the row.
ALTER TABLE workflow_run ALTER COLUMN definition DROP NOT NULL;
-- NOT VALID: every existing row has its copy; validating would scan the
-- table under an exclusive lock for nothing.
ALTER TABLE workflow_run ADD CONSTRAINT workflow_run_definition_known
    CHECK (definition IS NOT NULL OR workflow_version IS NOT NULL) NOT VALID;

-- What makes the reference as good as the copy: a stored version never
-- changes and never goes away. (An operator who must remove versions no
-- job points at can disable the trigger deliberately.)
CREATE FUNCTION workflow_definition_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'stored workflow versions are immutable: jobs read their definition from them'
        USING ERRCODE = 'restrict_violation';
END;
$$;
CREATE TRIGGER workflow_definition_immutable
    BEFORE UPDATE OR DELETE ON workflow_definition
    FOR EACH ROW EXECUTE FUNCTION workflow_definition_immutable();
