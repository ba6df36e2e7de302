"""Routes: labels."""

from fastapi import APIRouter

router = APIRouter()
