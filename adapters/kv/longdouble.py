"""walkit.adapters.kv.longdouble computes as a C `long double` (x87 80-bit) does: INCRBYFLOAT and HINCRBYFLOAT.

redis-server adds in `long double` (a 64-bit significand on x86-64) and writes the result with
"%.17Lf", trailing zeros trimmed. LongDouble does the same with exact rational arithmetic
rounded to that format, not the host's `long double` (128-bit on aarch64, 64-bit elsewhere),
so every node computes the same digits on any machine.
"""

from __future__ import annotations

import re
from fractions import Fraction


class LongDouble:
    """LongDouble reads, rounds and writes numbers as a C `long double` (x87 80-bit) does.

    A finite value is an exact Fraction; an infinite one is float("inf") or float("-inf").
    """

    MANTISSA = 64                   # significand bits, the leading one included
    MIN_EXP = -16382                # the exponent of the smallest normal number
    MAX_EXP = 16383                 # the exponent of the largest finite number
    TINY = MIN_EXP - (MANTISSA - 1)  # the exponent of the smallest subnormal's one bit
    MAX_CHARS = 5 * 1024            # redis-server's MAX_LONG_DOUBLE_CHARS

    _DECIMAL = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
    _HEX = re.compile(rb"([+-]?)0[xX]([0-9a-fA-F]*)\.?([0-9a-fA-F]*)(?:[pP]([+-]?[0-9]+))?\Z")
    _INF = re.compile(rb"([+-]?)inf(?:inity)?\Z", re.IGNORECASE)
    _SPACE = b" \t\n\v\f\r"

    @classmethod
    def round(cls, exact: Fraction):
        """round is the long double nearest `exact` (ties to even); an infinity if it overflows."""
        if exact == 0:
            return Fraction(0)
        num, den = abs(exact.numerator), exact.denominator
        exp = num.bit_length() - den.bit_length()
        if (num << max(-exp, 0)) < (den << max(exp, 0)):
            exp -= 1                    # now 2**exp <= |exact| < 2**(exp + 1)
        shift = (cls.MANTISSA - 1 - exp) if exp >= cls.MIN_EXP else -cls.TINY
        top, bottom = (num << shift, den) if shift >= 0 else (num, den << -shift)
        units, rest = divmod(top, bottom)
        if 2 * rest > bottom or (2 * rest == bottom and units & 1):
            units += 1
        if units.bit_length() + (-shift) > cls.MAX_EXP + 1:
            return float("inf") if exact > 0 else float("-inf")
        value = Fraction(units, 1 << shift) if shift >= 0 else Fraction(units << -shift)
        return value if exact > 0 else -value

    @classmethod
    def parse(cls, text: bytes):
        """parse reads `text` as redis-server's string2ld does (strtold, whole string); None if it is not a float.

        Rejected as there: empty or longer than MAX_CHARS, leading space, trailing bytes (a NUL
        byte too), NaN, an overflow and an underflow to zero.
        """
        if not text or len(text) >= cls.MAX_CHARS or text[0] in cls._SPACE:
            return None
        if cls._DECIMAL.match(text):
            exact = cls._decimal(text)
        elif (found := cls._HEX.match(text)) and (found.group(2) or found.group(3)):
            exact = cls._hex(*found.groups())
        elif found := cls._INF.match(text):
            return float("-inf") if found.group(1) == b"-" else float("inf")
        else:
            return None
        value = cls.round(exact)
        if isinstance(value, float) or (value == 0 and exact != 0):
            return None                 # ERANGE: overflow, or underflow to zero
        return value

    @classmethod
    def _decimal(cls, text: bytes) -> Fraction:
        mantissa, _, exponent = text.lower().partition(b"e")
        whole, _, fraction = mantissa.lstrip(b"+-").partition(b".")
        significant = (whole + fraction).lstrip(b"0")
        if not significant:
            return Fraction(0)
        power = _exponent(exponent) - len(fraction)
        magnitude = power + len(significant)    # 10**(magnitude - 1) <= |value| < 10**magnitude
        if magnitude > 4940:
            return Fraction(10 ** 4941)         # overflows
        if magnitude < -4960:
            return Fraction(1, 10 ** 4961)      # underflows to zero
        digits = significant.rstrip(b"0")
        value = _big_int(digits) * Fraction(10) ** (power + len(significant) - len(digits))
        return -value if text.startswith(b"-") else value

    @classmethod
    def _hex(cls, sign: bytes, whole: bytes, fraction: bytes, exponent: bytes | None) -> Fraction:
        digits = (whole + fraction).lstrip(b"0")
        if not digits:
            return Fraction(0)
        power = _exponent(exponent) - 4 * len(fraction)
        magnitude = power + 4 * len(digits)     # 2**(magnitude - 4) <= |value| < 2**magnitude
        if magnitude > cls.MAX_EXP + 8:
            return Fraction(2) ** (cls.MAX_EXP + 8)
        if magnitude < cls.TINY - 8:
            return Fraction(1, 1 << (-cls.TINY + 8))
        value = Fraction(int(digits, 16)) * Fraction(2) ** power
        return -value if sign == b"-" else value

    @classmethod
    def format(cls, value) -> bytes:
        """format writes a long double as redis-server's ld2string(LD_STR_HUMAN): "%.17Lf", trailing
        zeros trimmed, "-0" as "0"."""
        if isinstance(value, float):
            return b"inf" if value > 0 else b"-inf"
        units = round(abs(value) * 10 ** 17)    # printf rounds the exact value, ties to even
        whole, fraction = divmod(units, 10 ** 17)
        text = (_big_str(whole) + b".%017d" % fraction).rstrip(b"0").rstrip(b".")
        return b"-" + text if value < 0 and text != b"0" else text


def _big_int(digits: bytes) -> int:
    """_big_int reads a decimal integer of any length (int() refuses more than 4300 digits)."""
    value = 0
    for at in range(0, len(digits), 1000):
        chunk = digits[at:at + 1000]
        value = value * 10 ** len(chunk) + int(chunk)
    return value


def _big_str(value: int) -> bytes:
    """_big_str writes a non-negative integer of any length in decimal (str() refuses more than 4300 digits)."""
    chunks = []
    while value >= 10 ** 1000:
        value, chunk = divmod(value, 10 ** 1000)
        chunks.append(b"%01000d" % chunk)
    chunks.append(b"%d" % value)
    return b"".join(reversed(chunks))


def _exponent(text: bytes | None) -> int:
    """_exponent reads a float's exponent; one of more than nine digits is taken as +-2**40 (far out of range)."""
    if not text:
        return 0
    if len(text.lstrip(b"+-").lstrip(b"0")) > 9:
        return -1 << 40 if text.startswith(b"-") else 1 << 40
    return int(text)


# -- commands ------------------------------------------------------------------------------------
