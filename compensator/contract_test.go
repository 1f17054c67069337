package compensator_test

import (
	"orderpipe/shared/orderevent/contract"
)

// holdsTheContract validates every message of the world's stream — first
// emissions, re-drives, re-notifies and heal copies — against the AsyncAPI
// document.
func (w *world) holdsTheContract() {
	w.t.Helper()
	ev, err := contract.DefaultEvents()
	if err != nil {
		w.t.Fatal(err)
	}
	msgs, err := ev.ValidateStream(w.t.Context(), w.nats.JS, w.nats.Topology)
	if err != nil {
		w.t.Error(err)
	}
	if len(msgs) == 0 {
		w.t.Error("the stream holds no message: the contract check proved nothing")
	}
}
