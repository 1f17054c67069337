package pspserver

// QueuedCharges is how many charges wait for the charges' next statement.
func (s *Server) QueuedCharges() int { return s.charges.Len() }

// RecordBatch records one charge per key (3.00 CNY, decided succeeded)
// in one batch, as the charges' flush does, and returns whether each
// was new and its error.
func RecordBatch(s *Server, keys ...string) (inserted []bool, errs []error) {
	batch := make([]*newCharge, len(keys))
	for i, k := range keys {
		batch[i] = &newCharge{key: k, fp: []byte("fp"), chargeID: "ch_" + k, amount: "3.00", currency: "CNY",
			reference: "r", state: "succeeded", done: make(chan recorded, 1)}
	}
	s.recordBatch(batch)
	for _, c := range batch {
		r := <-c.done
		inserted, errs = append(inserted, r.inserted), append(errs, r.err)
	}
	return inserted, errs
}
