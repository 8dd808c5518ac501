"""What a run leaves behind: the calls each rank made (``calls``, the format the GPU labs
write too), every message (``trace``), the streams over time (``timeline``), the bytes each
rank holds (``memory``), where a rank's step went (``breakdown``), and the text tables they print
as (``table``)."""
