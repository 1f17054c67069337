package producer

import (
	"github.com/google/uuid"

	"orderpipe/shared/orderstore"
)

// Route is an operation of the API as the router registers it (tests).
type Route struct {
	Method, Pattern string
	Statuses        []int
}

// Routes returns every operation with all the statuses it may answer.
func Routes() []Route {
	var out []Route
	for _, r := range routes {
		st := append([]int(nil), r.statuses...)
		if r.guarded {
			st = append(st, guardedStatuses...)
		}
		out = append(out, Route{r.method, r.pattern, st})
	}
	return out
}

// Waiters is how many create requests wait for the one of clientID and
// requestID that this process is writing (0 when none is in flight).
func (s *Service) Waiters(clientID uuid.UUID, requestID string) int {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	if l := s.batch.inFlight[orderstore.Key{ClientID: clientID, RequestID: requestID}]; l != nil {
		return l.waiters
	}
	return 0
}
