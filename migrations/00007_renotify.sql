-- +goose Up
-- The compensator re-publishes the final event of a terminal order whose
-- last change has no webhook delivery (an event the broker lost after
-- acknowledging it), and records it as a 'renotify' action. The index keeps
-- that scan to the recent terminal orders that expect a webhook.
ALTER TABLE compensator_actions DROP CONSTRAINT compensator_actions_action_check;
ALTER TABLE compensator_actions ADD CONSTRAINT compensator_actions_action_check
    CHECK (action IN ('redrive', 'unwind', 'refund', 'skip', 'renotify'));
CREATE INDEX orders_renotify_idx ON orders (updated_at)
    WHERE callback_url IS NOT NULL AND status IN ('confirmed', 'rejected', 'cancelled');

-- +goose Down
DROP INDEX orders_renotify_idx;
DELETE FROM compensator_actions WHERE action = 'renotify';
ALTER TABLE compensator_actions DROP CONSTRAINT compensator_actions_action_check;
ALTER TABLE compensator_actions ADD CONSTRAINT compensator_actions_action_check
    CHECK (action IN ('redrive', 'unwind', 'refund', 'skip'));
