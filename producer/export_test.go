package producer

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
