-- +goose Up
-- Void: a charge key whose outcome is unknown is resolved without ever
-- charging (DESIGN.md, the provider's wire contract). The provider stand-in
-- keeps a voided key as a psp_charges row in state 'voided' (no amount: it
-- was never charged); a later charge with that key is answered 410. Our
-- payments row records the same outcome as 'voided', with the reason when
-- the provider refused the charge outright.
ALTER TABLE psp_charges DROP CONSTRAINT psp_charges_state_check;
ALTER TABLE psp_charges ADD CONSTRAINT psp_charges_state_check
    CHECK (state IN ('in_flight', 'succeeded', 'declined', 'voided'));
ALTER TABLE psp_charges ALTER COLUMN amount DROP NOT NULL;
ALTER TABLE psp_charges ALTER COLUMN currency DROP NOT NULL;
ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check
    CHECK (status IN ('pending', 'succeeded', 'declined', 'refunded', 'voided'));

-- +goose Down
DELETE FROM psp_charges WHERE state = 'voided';
ALTER TABLE psp_charges ALTER COLUMN currency SET NOT NULL;
ALTER TABLE psp_charges ALTER COLUMN amount SET NOT NULL;
ALTER TABLE psp_charges DROP CONSTRAINT psp_charges_state_check;
ALTER TABLE psp_charges ADD CONSTRAINT psp_charges_state_check
    CHECK (state IN ('in_flight', 'succeeded', 'declined'));
UPDATE payments SET status = 'declined' WHERE status = 'voided';
ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check
    CHECK (status IN ('pending', 'succeeded', 'declined', 'refunded'));
