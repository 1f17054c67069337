package config

import "reflect"

// FillZero sets every zero field of *dst to the same field of defaults: the
// one way a part's options struct, whose zero fields mean "the default",
// gets its defaults. defaults is a value of the struct that holds each
// default once (its zero fields leave dst's alone). T must be a struct.
func FillZero[T any](dst *T, defaults T) {
	fill(dst, defaults, reflect.Value.IsZero)
}

// FillNotPositive is FillZero for options in which a number below zero
// means the default too: it also replaces the negative numeric fields.
func FillNotPositive[T any](dst *T, defaults T) {
	fill(dst, defaults, notPositive)
}

func fill[T any](dst *T, defaults T, unset func(reflect.Value) bool) {
	d, def := reflect.ValueOf(dst).Elem(), reflect.ValueOf(defaults)
	for i := range d.NumField() {
		if v := def.Field(i); !v.IsZero() && unset(d.Field(i)) {
			d.Field(i).Set(v)
		}
	}
}

// notPositive reports whether v is a number of at most 0, or else zero.
func notPositive(v reflect.Value) bool {
	switch {
	case v.CanInt():
		return v.Int() <= 0
	case v.CanFloat():
		return v.Float() <= 0
	}
	return v.IsZero()
}
