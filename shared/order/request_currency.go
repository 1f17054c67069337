package order

import "strings"

// activeCurrencies lists the ISO 4217 codes of the currencies in use in
// 2026 (after Croatia's and Bulgaria's moves to the euro, Sierra Leone's
// SLE, Zimbabwe's ZWG and the Caribbean guilder XCG), each with its number
// of minor units. Fund codes (BOV, CHE, CHW, CLF, COU, MXV, USN, UYI, UYW),
// precious metals (XAU, XAG, XPD, XPT), bond-market units (XBA-XBD), the SDR
// (XDR), XSU, XUA and the testing and no-currency codes (XTS, XXX) are not
// currencies an order is paid in and are refused.
const activeCurrencies = `
AED2 AFN2 ALL2 AMD2 AOA2 ARS2 AUD2 AWG2 AZN2 BAM2 BBD2 BDT2 BHD3 BIF0 BMD2
BND2 BOB2 BRL2 BSD2 BTN2 BWP2 BYN2 BZD2 CAD2 CDF2 CHF2 CLP0 CNY2 COP2 CRC2
CUP2 CVE2 CZK2 DJF0 DKK2 DOP2 DZD2 EGP2 ERN2 ETB2 EUR2 FJD2 FKP2 GBP2 GEL2
GHS2 GIP2 GMD2 GNF0 GTQ2 GYD2 HKD2 HNL2 HTG2 HUF2 IDR2 ILS2 INR2 IQD3 IRR2
ISK0 JMD2 JOD3 JPY0 KES2 KGS2 KHR2 KMF0 KPW2 KRW0 KWD3 KYD2 KZT2 LAK2 LBP2
LKR2 LRD2 LSL2 LYD3 MAD2 MDL2 MGA2 MKD2 MMK2 MNT2 MOP2 MRU2 MUR2 MVR2 MWK2
MXN2 MYR2 MZN2 NAD2 NGN2 NIO2 NOK2 NPR2 NZD2 OMR3 PAB2 PEN2 PGK2 PHP2 PKR2
PLN2 PYG0 QAR2 RON2 RSD2 RUB2 RWF0 SAR2 SBD2 SCR2 SDG2 SEK2 SGD2 SHP2 SLE2
SOS2 SRD2 SSP2 STN2 SVC2 SYP2 SZL2 THB2 TJS2 TMT2 TND3 TOP2 TRY2 TTD2 TWD2
TZS2 UAH2 UGX0 USD2 UYU2 UZS2 VED2 VES2 VND0 VUV0 WST2 XAF0 XCD2 XCG2 XOF0
XPF0 YER2 ZAR2 ZMW2 ZWG2
`

var currencies = func() map[string]int {
	m := map[string]int{}
	for _, f := range strings.Fields(activeCurrencies) {
		m[f[:3]] = int(f[3] - '0')
	}
	return m
}()

// CurrencyMinorUnits returns the number of decimals of an active ISO 4217
// currency (2 for CNY, 0 for JPY, 3 for KWD) and whether code is one. Codes
// are upper case; "cny" is not a code.
func CurrencyMinorUnits(code string) (int, bool) {
	n, ok := currencies[code]
	return n, ok
}

// Currencies returns the accepted currency codes, sorted.
func Currencies() []string {
	out := make([]string, 0, len(currencies))
	for _, f := range strings.Fields(activeCurrencies) {
		out = append(out, f[:3])
	}
	return out
}
