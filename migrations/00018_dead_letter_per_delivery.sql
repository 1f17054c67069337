-- +goose Up
-- dead_letters.stream_seq: the stream sequence of the copy that was
-- dead-lettered. A message is acked only once its dead letter is stored, so
-- an ack lost after the store brings the same copy back: the unique key
-- makes storing it again return the first dead letter instead of adding
-- a second. Rows from before have no sequence and are left as they are.
ALTER TABLE dead_letters ADD COLUMN stream_seq bigint CHECK (stream_seq > 0);
CREATE UNIQUE INDEX dead_letters_copy_key ON dead_letters (consumer, message_id, stream_seq);

-- +goose Down
DROP INDEX dead_letters_copy_key;
ALTER TABLE dead_letters DROP COLUMN stream_seq;
