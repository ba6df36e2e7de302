"""Routes: batches."""

from fastapi import APIRouter

router = APIRouter()
