from nanorl.rewards import contains, exact, extract_final_number, final_number, overlong_penalty


def test_final_number_takes_the_last_number():
    assert final_number("2+2?", "2 + 2 = 4.", answer=4) == 1.0
    assert final_number("2+2?", "it is 4, not 5", answer=4) == 0.0
    assert final_number("", "1,234", answer="1234") == 1.0
    assert final_number("", "no digits here", answer=0) == 0.0
    assert extract_final_number("-3.5 and then -7") == -7.0
    assert exact("", "  42 ", answer=42) == 1.0 and contains("", "x = 42!", answer=42) == 1.0


def test_dapo_soft_overlong_penalty():
    # max 32 tokens, buffer 8: free up to 24, then a linear ramp to -1 at 32
    assert overlong_penalty(10, 32, 8) == 0.0 and overlong_penalty(24, 32, 8) == 0.0
    assert overlong_penalty(28, 32, 8) == -0.5
    assert overlong_penalty(32, 32, 8) == -1.0 and overlong_penalty(40, 32, 8) == -1.0
