-- Room on each page for the new versions of a run row: a checkpoint changes
-- no indexed column, so its update can stay on the same page (a HOT update:
-- no index entry written) when the page has space. New pages only; existing
-- pages keep what they have until rewritten.
ALTER TABLE workflow_run SET (fillfactor = 80);
