package compensator

import "time"

// ConsumerHorizon is how long the consumers may keep redelivering one
// message before they dead-letter it: the compensator's stuck deadlines
// must be longer, and its dedupe retention must cover it.
func ConsumerHorizon() time.Duration {
	return DefaultConsumerHorizon
}
